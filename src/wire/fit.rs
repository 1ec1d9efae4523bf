//! What a node has and what its models take on the wire (v1.7): its inventory, a managed
//! adapter's budget and a target's footprint.

use crate::domain::inventory::{Device, DeviceKind, Inventory};
use crate::domain::models::{Budget, Footprint, FootprintSource};

use super::proto;

pub(super) fn inventory_to_wire(inventory: Inventory) -> proto::Inventory {
    let Inventory { devices } = inventory;
    proto::Inventory {
        devices: devices
            .into_iter()
            .map(|device| {
                let Device {
                    index,
                    kind,
                    name,
                    total_bytes,
                    used_bytes,
                } = device;
                let kind = match kind {
                    DeviceKind::Gpu => proto::DeviceKind::Gpu,
                    DeviceKind::Memory => proto::DeviceKind::Memory,
                };
                proto::Device {
                    index,
                    kind: kind.into(),
                    name,
                    total_bytes,
                    used_bytes,
                }
            })
            .collect(),
    }
}

/// A device of a kind this edge does not know is left out.
pub(super) fn inventory_from_wire(inventory: proto::Inventory) -> Inventory {
    let proto::Inventory { devices } = inventory;
    Inventory {
        devices: devices
            .into_iter()
            .filter_map(|device| {
                let proto::Device {
                    index,
                    kind,
                    name,
                    total_bytes,
                    used_bytes,
                } = device;
                let kind = match proto::DeviceKind::try_from(kind).ok()? {
                    proto::DeviceKind::Unspecified => return None,
                    proto::DeviceKind::Gpu => DeviceKind::Gpu,
                    proto::DeviceKind::Memory => DeviceKind::Memory,
                };
                Some(Device {
                    index,
                    kind,
                    name,
                    total_bytes,
                    used_bytes,
                })
            })
            .collect(),
    }
}

/// A budget of 0 bytes is none.
pub(super) fn budget_from_wire(bytes: u64, devices: Vec<u32>) -> Option<Budget> {
    (bytes > 0).then_some(Budget { bytes, devices })
}

pub(super) fn footprint_to_wire(footprint: Footprint) -> proto::Footprint {
    let Footprint {
        bytes,
        weights,
        kv_cache,
        overhead,
        context,
        source,
    } = footprint;
    proto::Footprint {
        bytes,
        weights_bytes: weights,
        kv_cache_bytes: kv_cache,
        overhead_bytes: overhead,
        context,
        source: source.as_str().to_owned(),
    }
}

/// A footprint of 0 bytes, or from a source this edge does not know, is none.
pub(super) fn footprint_from_wire(footprint: proto::Footprint) -> Option<Footprint> {
    let proto::Footprint {
        bytes,
        weights_bytes,
        kv_cache_bytes,
        overhead_bytes,
        context,
        source,
    } = footprint;
    (bytes > 0).then_some(())?;
    Some(Footprint {
        bytes,
        weights: weights_bytes,
        kv_cache: kv_cache_bytes,
        overhead: overhead_bytes,
        context,
        source: FootprintSource::parse(&source)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_and_a_footprint_round_trip() {
        let inventory = Inventory {
            devices: vec![
                Device {
                    index: 0,
                    kind: DeviceKind::Gpu,
                    name: "NVIDIA GeForce RTX 4090".into(),
                    total_bytes: 25_757_220_864,
                    used_bytes: 1_024,
                },
                Device {
                    index: 1,
                    kind: DeviceKind::Memory,
                    name: "memory".into(),
                    total_bytes: 8 << 30,
                    used_bytes: 0,
                },
            ],
        };
        let back = inventory_from_wire(inventory_to_wire(inventory.clone()));
        assert_eq!(back, inventory);
        let footprint = Footprint {
            bytes: 300,
            weights: 200,
            kv_cache: 60,
            overhead: 40,
            context: 4_096,
            source: FootprintSource::Gguf,
        };
        assert_eq!(
            footprint_from_wire(footprint_to_wire(footprint)),
            Some(footprint)
        );
        let unknown = proto::Footprint {
            bytes: 1,
            source: "tea_leaves".into(),
            ..proto::Footprint::default()
        };
        assert_eq!(footprint_from_wire(unknown), None);
        assert_eq!(budget_from_wire(0, vec![0]), None);
    }
}
