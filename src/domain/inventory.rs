//! A node's hardware as it reports it (protocol v1.7): its devices — each GPU NVML lists, or
//! the machine's memory as one device where there is none — with their memory, and byte
//! sizes as operators write and read them (`memory = "20GiB"`).
//!
//! Plain values: the node measures, the edge shows and places by what the node's adapters
//! budget; nothing here reads a device or a clock.

use std::fmt;

/// What a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A GPU (NVML's).
    Gpu,
    /// The machine's memory, standing for the one device of a machine without a GPU.
    Memory,
}

impl DeviceKind {
    /// Its name in the management API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gpu => "gpu",
            Self::Memory => "memory",
        }
    }
}

/// One device of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its index among the node's devices (NVML's index; 0 for the machine's memory): what
    /// an adapter's `devices` setting names.
    pub index: u32,
    /// A GPU or the machine's memory.
    pub kind: DeviceKind,
    /// Its name (`NVIDIA GeForce RTX 4090`, `memory`).
    pub name: String,
    /// Its memory, in bytes.
    pub total_bytes: u64,
    /// How much of it is in use now, by anything on the machine, in bytes.
    pub used_bytes: u64,
}

/// A node's devices, as it measured them last.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inventory {
    /// Its devices, by index.
    pub devices: Vec<Device>,
}

impl Inventory {
    /// The device of `index`.
    pub fn device(&self, index: u32) -> Option<&Device> {
        self.devices.iter().find(|d| d.index == index)
    }

    /// The memory of every device, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.total_bytes).sum()
    }
}

/// A number of bytes written for people: `17 B`, `512 KiB`, `250.0 MiB`, `1.50 GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: u64 = 1 << 10;
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let n = self.0;
        // Shown to people only: the rounding of the conversion is the point.
        #[allow(clippy::cast_precision_loss)]
        let scaled = |unit: u64| n as f64 / unit as f64;
        match n {
            0..KIB => write!(f, "{n} B"),
            KIB..MIB => write!(f, "{} KiB", n / KIB),
            MIB..GIB => write!(f, "{:.1} MiB", scaled(MIB)),
            _ => write!(f, "{:.2} GiB", scaled(GIB)),
        }
    }
}

/// Why a byte size cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytesError {
    /// It is not a number followed by a unit.
    #[error(
        "{value:?} is not a size: write a number and a unit, `20GiB`, `512MiB`, `1.5GB` \
         (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
    )]
    NotASize {
        /// What was written.
        value: String,
    },
}

/// Reads a byte size as operators write it: a number (a decimal fraction allowed) and a
/// unit, binary (`KiB`, `MiB`, `GiB`, `TiB`) or decimal (`KB`, `MB`, `GB`, `TB`), or `B` or
/// none for bytes; case and spaces do not matter (`20GiB`, `20 gib`, `1.5GB`).
///
/// # Errors
/// [`BytesError::NotASize`] for anything else.
pub fn parse_bytes(value: &str) -> Result<u64, BytesError> {
    let not_a_size = || BytesError::NotASize {
        value: value.to_owned(),
    };
    let text: String = value
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: u64 = match unit {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(not_a_size()),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(not_a_size());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| not_a_size())?
    };
    let bytes = whole.checked_mul(scale).ok_or_else(not_a_size)?;
    // The fraction's digits as a ratio (`.25`: 25 / 100), taken of the unit at once.
    let (mut numerator, mut denominator) = (0u128, 1u128);
    for digit in fraction.chars().take(18) {
        numerator = numerator * 10 + u128::from(digit.to_digit(10).ok_or_else(not_a_size)?);
        denominator *= 10;
    }
    if !fraction.chars().all(|c| c.is_ascii_digit()) {
        return Err(not_a_size());
    }
    let part =
        u64::try_from(u128::from(scale) * numerator / denominator).map_err(|_| not_a_size())?;
    bytes.checked_add(part).ok_or_else(not_a_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_operators_write_them() {
        assert_eq!(parse_bytes("20GiB"), Ok(20 << 30));
        assert_eq!(parse_bytes(" 20 gib "), Ok(20 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("10B"), Ok(10));
        assert_eq!(parse_bytes(".5KiB"), Ok(512));
        for bad in [
            "",
            "GiB",
            "20 GiBs",
            "twenty",
            "1.2.3GiB",
            "-1GiB",
            "99999999999TiB",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sizes_print_short() {
        assert_eq!(Bytes(17).to_string(), "17 B");
        assert_eq!(Bytes(512 << 10).to_string(), "512 KiB");
        assert_eq!(Bytes(250 << 20).to_string(), "250.0 MiB");
        assert_eq!(Bytes(3 << 29).to_string(), "1.50 GiB");
    }
}
