//! The per-request event channel. The scheduler holds the [`EventSender`], the client the
//! [`RequestStream`]; events can be awaited (`recv_async`, for an async server) or received
//! blocking (`recv`, the iterator). Dropping the stream cancels the request: the scheduler sees
//! the flag at its next step and frees the request's blocks.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::request::Event;

struct State {
    /// Events sent and not yet received.
    events: VecDeque<Event>,
    /// The sender is gone: no more events will come.
    closed: bool,
    /// Task waiting in `recv_async`.
    waker: Option<Waker>,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
    cancelled: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the queue consistent: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A new channel for request `id`.
pub(crate) fn channel(id: u64) -> (EventSender, RequestStream) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { events: VecDeque::new(), closed: false, waker: None }),
        ready: Condvar::new(),
        cancelled: AtomicBool::new(false),
    });
    (EventSender { shared: shared.clone() }, RequestStream { shared, id })
}

/// The scheduler's end. Dropping it closes the stream.
pub(crate) struct EventSender {
    shared: Arc<Shared>,
}

impl EventSender {
    pub(crate) fn send(&self, event: Event) {
        let waker = {
            let mut s = self.shared.lock();
            s.events.push_back(event);
            s.waker.take()
        };
        self.shared.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether the client dropped its stream.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.shared.cancelled.load(Ordering::Acquire)
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.shared.lock();
            s.closed = true;
            s.waker.take()
        };
        self.shared.ready.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The client's end of one request: its events, in order. Dropping it cancels the request.
pub struct RequestStream {
    shared: Arc<Shared>,
    id: u64,
}

impl RequestStream {
    /// The engine's id of this request (unique per engine).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Blocks until the next event; `None` once the stream has ended.
    pub fn recv(&mut self) -> Option<Event> {
        let mut s = self.shared.lock();
        loop {
            if let Some(e) = s.events.pop_front() {
                return Some(e);
            }
            if s.closed {
                return None;
            }
            s = self.shared.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Like [`Self::recv`] with a deadline: `Timeout` if nothing came in time, `Disconnected`
    /// once the stream has ended.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.shared.lock();
        loop {
            if let Some(e) = s.events.pop_front() {
                return Ok(e);
            }
            if s.closed {
                return Err(RecvTimeoutError::Disconnected);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RecvTimeoutError::Timeout);
            }
            s = self.shared.ready.wait_timeout(s, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The next event if one is ready: `Empty` if none yet, `Disconnected` once the stream
    /// has ended.
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        let mut s = self.shared.lock();
        match s.events.pop_front() {
            Some(e) => Ok(e),
            None if s.closed => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Awaits the next event; `None` once the stream has ended. Works on any executor.
    pub fn recv_async(&mut self) -> impl Future<Output = Option<Event>> + '_ {
        RecvFuture { stream: self }
    }

    /// Cancels the request (the same as dropping the stream).
    pub fn cancel(self) {}
}

impl Iterator for RequestStream {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.shared.cancelled.store(true, Ordering::Release);
    }
}

struct RecvFuture<'a> {
    stream: &'a mut RequestStream,
}

impl Future for RecvFuture<'_> {
    type Output = Option<Event>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        let mut s = self.stream.shared.lock();
        if let Some(e) = s.events.pop_front() {
            return Poll::Ready(Some(e));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{EngineError, Event};
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    #[test]
    fn events_in_order_then_end() {
        let (tx, mut rx) = channel(7);
        assert_eq!(rx.id(), 7);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        tx.send(Event::Error(EngineError::ShutDown));
        tx.send(Event::Error(EngineError::EmptyPrompt));
        drop(tx);
        assert_eq!(rx.recv(), Some(Event::Error(EngineError::ShutDown)));
        assert_eq!(rx.recv_timeout(Duration::from_millis(1)), Ok(Event::Error(EngineError::EmptyPrompt)));
        assert_eq!(rx.recv(), None);
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    }

    #[test]
    fn drop_cancels_and_recv_blocks_across_threads() {
        let (tx, mut rx) = channel(1);
        assert!(!tx.is_cancelled());
        assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(Event::Error(EngineError::ZeroMaxTokens));
            tx
        });
        assert_eq!(rx.recv(), Some(Event::Error(EngineError::ZeroMaxTokens)));
        let tx = t.join().unwrap();
        drop(rx);
        assert!(tx.is_cancelled());
    }

    struct CountWake(AtomicUsize);
    impl Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn async_receive_wakes_the_task() {
        let (tx, mut rx) = channel(2);
        let counter = Arc::new(CountWake(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        {
            let mut fut = std::pin::pin!(rx.recv_async());
            assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
            tx.send(Event::Error(EngineError::ShutDown));
            assert_eq!(counter.0.load(Ordering::SeqCst), 1);
            assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Some(Event::Error(EngineError::ShutDown))));
        }
        let mut fut = std::pin::pin!(rx.recv_async());
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        drop(tx);
        assert_eq!(counter.0.load(Ordering::SeqCst), 2);
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(None));
    }
}
