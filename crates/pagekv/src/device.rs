//! Where the model runs (`--device` / `PAGEKV_DEVICE`).

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

impl Device {
    /// Reads `PAGEKV_DEVICE` (`cpu`, `cuda`, `cuda:N`; default `cpu`).
    pub fn from_env() -> anyhow::Result<Device> {
        match crate::config::env_lookup("PAGEKV_DEVICE") {
            Some(v) if !v.trim().is_empty() => Device::parse(v.trim()),
            _ => Ok(Device::Cpu),
        }
    }

    pub fn parse(v: &str) -> anyhow::Result<Device> {
        let bad = || {
            anyhow::anyhow!("invalid device {v:?} (--device / PAGEKV_DEVICE): accepted values are cpu, cuda, cuda:N")
        };
        match v {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => {
                let n = v.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

impl Device {
    /// What one more token costs in a sequence's step on this device, as a fraction of a
    /// one-token step: the adaptive draft length's price of a draft token
    /// (`SpeculativeConfig::token_cost`). A GPU step is bound by reading the weights, which
    /// every token of the step shares; a CPU step on a few cores pays for each token's
    /// arithmetic as well.
    pub fn draft_token_cost(&self) -> f32 {
        match self {
            Device::Cpu => 0.15,
            Device::Cuda(_) => 0.02,
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_bad_ones_name_the_flag() {
        assert_eq!(Device::parse("cpu").unwrap(), Device::Cpu);
        assert_eq!(Device::parse("cuda").unwrap(), Device::Cuda(0));
        assert_eq!(Device::parse("cuda:3").unwrap(), Device::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "CPU", "cuda:-1"] {
            let e = Device::parse(bad).unwrap_err().to_string();
            assert!(e.contains("PAGEKV_DEVICE") && e.contains("cuda:N"), "{e}");
        }
    }
}
