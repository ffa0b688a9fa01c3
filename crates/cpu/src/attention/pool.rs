//! The thread pool an attention operator runs on.

use std::sync::Arc;

use crate::threadpool::ThreadPool;

/// The thread pool an [`Attention`](super::Attention) runs on: the process-wide one or an owned
/// one.
#[derive(Clone, Debug)]
pub enum PoolHandle {
    Static(&'static ThreadPool),
    Shared(Arc<ThreadPool>),
}

impl std::ops::Deref for PoolHandle {
    type Target = ThreadPool;
    fn deref(&self) -> &ThreadPool {
        match self {
            PoolHandle::Static(p) => p,
            PoolHandle::Shared(p) => p,
        }
    }
}

impl From<&'static ThreadPool> for PoolHandle {
    fn from(p: &'static ThreadPool) -> Self {
        PoolHandle::Static(p)
    }
}

impl From<Arc<ThreadPool>> for PoolHandle {
    fn from(p: Arc<ThreadPool>) -> Self {
        PoolHandle::Shared(p)
    }
}
