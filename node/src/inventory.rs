//! The node's devices and their memory (protocol v1.7): each GPU NVML lists, or, on a
//! machine without one, the machine's memory as one device (index 0) from `/proc/meminfo`.
//!
//! NVML is loaded at run time (`nvml-wrapper` opens `libnvidia-ml.so.1` when asked), so the
//! same binary runs where no NVIDIA driver is installed: there the library is not found and
//! the machine's memory stands in. What NVML and `/proc/meminfo` answer is turned into an
//! [`Inventory`] by pure functions ([`from_nvml`], [`from_meminfo`]), tested on their
//! answers; [`Prober`] asks them, and [`keep_current`] measures again every
//! [`MEASURE_EVERY`], publishing when a device's use moved by at least 1 % of its memory.

use std::sync::Arc;
use std::time::Duration;

use edge::domain::{Device, DeviceKind, Inventory};
use nvml_wrapper::Nvml;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the devices are measured again.
pub const MEASURE_EVERY: Duration = Duration::from_secs(10);

/// What NVML answers of one GPU: `nvmlDeviceGetName` and `nvmlDeviceGetMemoryInfo_v2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlAnswer {
    /// Its NVML index (nvidia-smi's).
    pub index: u32,
    /// Its name.
    pub name: String,
    /// `total`: its memory, in bytes.
    pub total: u64,
    /// `free`: what is neither used nor reserved, in bytes.
    pub free: u64,
}

/// The GPUs NVML answered for, as devices: the memory in use is all that is not free (the
/// driver's reservation included).
pub fn from_nvml(answers: &[NvmlAnswer]) -> Inventory {
    Inventory {
        devices: answers
            .iter()
            .map(|answer| Device {
                index: answer.index,
                kind: DeviceKind::Gpu,
                name: answer.name.clone(),
                total_bytes: answer.total,
                used_bytes: answer.total.saturating_sub(answer.free),
            })
            .collect(),
    }
}

/// The machine's memory as one device, from `/proc/meminfo`'s `MemTotal` and
/// `MemAvailable` (in kB); `None` when either is missing.
pub fn from_meminfo(meminfo: &str) -> Option<Inventory> {
    let field = |name: &str| {
        meminfo.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kb * 1024)
        })
    };
    let total = field("MemTotal")?;
    let available = field("MemAvailable")?;
    Some(Inventory {
        devices: vec![Device {
            index: 0,
            kind: DeviceKind::Memory,
            name: "memory".to_owned(),
            total_bytes: total,
            used_bytes: total.saturating_sub(available),
        }],
    })
}

/// Whether `new` is worth telling the edge after `old`: another set of devices, or one
/// whose use moved by at least 1 % of its memory.
pub fn changed_enough(old: &Inventory, new: &Inventory) -> bool {
    if old.devices.len() != new.devices.len() {
        return true;
    }
    old.devices.iter().zip(&new.devices).any(|(a, b)| {
        a.index != b.index
            || a.kind != b.kind
            || a.name != b.name
            || a.total_bytes != b.total_bytes
            || a.used_bytes.abs_diff(b.used_bytes) >= b.total_bytes / 100
    })
}

/// Measures the node's devices: through NVML when its library loads and lists a GPU, else
/// the machine's memory.
pub struct Prober {
    nvml: Option<Nvml>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("nvml", &self.nvml.is_some())
            .finish()
    }
}

impl Prober {
    /// Loads NVML if the machine has it, and says which way the devices will be measured.
    pub fn detect() -> Self {
        let nvml = match Nvml::init() {
            Ok(nvml) => Some(nvml),
            Err(error) => {
                tracing::info!(%error, "no NVIDIA GPU through NVML: the machine's memory is the node's one device");
                None
            }
        };
        let prober = Self { nvml };
        if prober.nvml.is_some() && prober.nvml_answers().is_empty() {
            tracing::info!("NVML lists no GPU: the machine's memory is the node's one device");
            return Self { nvml: None };
        }
        prober
    }

    /// What NVML answers of each GPU it lists (none without NVML, and a GPU it cannot
    /// answer for is left out).
    fn nvml_answers(&self) -> Vec<NvmlAnswer> {
        let Some(nvml) = &self.nvml else {
            return Vec::new();
        };
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let memory = device.memory_info().ok()?;
                Some(NvmlAnswer {
                    index,
                    name: device.name().unwrap_or_else(|_| format!("GPU {index}")),
                    total: memory.total,
                    free: memory.free,
                })
            })
            .collect()
    }

    /// The node's devices now.
    pub fn measure(&self) -> Inventory {
        if self.nvml.is_some() {
            return from_nvml(&self.nvml_answers());
        }
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| from_meminfo(&text))
            .unwrap_or_default()
    }
}

/// Measures the devices every [`MEASURE_EVERY`] until `stop`, publishing on `current` when
/// they changed enough to tell ([`changed_enough`]). Each measurement runs on a blocking
/// thread: NVML's calls may take milliseconds.
pub async fn keep_current(
    prober: Arc<Prober>,
    current: watch::Sender<Inventory>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(MEASURE_EVERY) => {}
        }
        let measuring = Arc::clone(&prober);
        let Ok(measured) = tokio::task::spawn_blocking(move || measuring.measure()).await else {
            continue;
        };
        current.send_if_modified(|known| {
            let changed = changed_enough(known, &measured);
            if changed {
                *known = measured;
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVML's answers as two cards give them: an RTX 4090 (nvidia-smi's "FB Memory Usage"
    /// total of 24,564 MiB) with a desktop on it, and an idle A100 80GB (81,920 MiB). The
    /// driver's reservation is part of what is not free.
    fn answers() -> Vec<NvmlAnswer> {
        vec![
            NvmlAnswer {
                index: 0,
                name: "NVIDIA GeForce RTX 4090".into(),
                total: 25_757_220_864,
                free: 24_859_639_808,
            },
            NvmlAnswer {
                index: 1,
                name: "NVIDIA A100-SXM4-80GB".into(),
                total: 85_899_345_920,
                free: 85_030_076_416,
            },
        ]
    }

    #[test]
    fn each_gpu_nvml_answers_for_is_a_device() {
        let inventory = from_nvml(&answers());
        assert_eq!(inventory.devices.len(), 2);
        let rtx = &inventory.devices[0];
        assert_eq!((rtx.index, rtx.kind), (0, DeviceKind::Gpu));
        assert_eq!(rtx.name, "NVIDIA GeForce RTX 4090");
        assert_eq!(rtx.total_bytes, 24_564 << 20);
        assert_eq!(rtx.used_bytes, 856 << 20);
        assert_eq!(inventory.device(1).map(|d| d.total_bytes), Some(80 << 30));
        assert_eq!(inventory.total_bytes(), (24_564 << 20) + (80 << 30));
    }

    #[test]
    fn without_a_gpu_the_machines_memory_is_the_one_device() {
        let meminfo = "MemTotal:       24683916 kB\nMemFree:         1534040 kB\n\
                       MemAvailable:   20122212 kB\nBuffers:          250912 kB\n";
        let inventory = from_meminfo(meminfo).expect("an inventory");
        assert_eq!(inventory.devices.len(), 1);
        let memory = &inventory.devices[0];
        assert_eq!((memory.index, memory.kind), (0, DeviceKind::Memory));
        assert_eq!(memory.total_bytes, 24_683_916 * 1024);
        assert_eq!(memory.used_bytes, (24_683_916 - 20_122_212) * 1024);
        assert_eq!(from_meminfo("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn this_machine_is_measured_without_nvidia_drivers() {
        // No GPU here: NVML's library is not found, and the machine's memory is measured.
        let prober = Prober::detect();
        let inventory = prober.measure();
        assert!(!inventory.devices.is_empty(), "{inventory:?}");
        assert!(inventory.devices[0].total_bytes > 0);
    }

    #[test]
    fn a_move_of_one_percent_is_told() {
        let before = from_nvml(&answers());
        let mut after = before.clone();
        after.devices[1].used_bytes += 100 << 20;
        assert!(!changed_enough(&before, &after), "0.1 % of 80 GiB");
        after.devices[1].used_bytes += 1 << 30;
        assert!(changed_enough(&before, &after));
        assert!(changed_enough(&before, &Inventory::default()));
    }
}
