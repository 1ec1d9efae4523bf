//! What each adapter may use for models (protocol v1.7): its `memory` setting (`"20GiB"`)
//! on the devices its `devices` setting names (`"0,1"`, the node's device indices), by
//! default all the memory of the devices it uses less [`MARGIN_PERCENT`] %, and all of the
//! node's devices.
//!
//! An adapter has a budget when it has a `lifecycle` (the edge places loads on it) or sets
//! `memory` (it holds that much of its devices for a fixed model). Adapters sharing a device
//! may not together budget more than it has: each one's budget is spread over its devices in
//! proportion to their memory, and where the shares of a device add up to more than it has,
//! every adapter on it is misconfigured, said when the node configures its adapters. Pure:
//! the settings and the inventory in, the budgets (or why not) out.

use std::collections::BTreeMap;

use edge::client::ReceivedAdapter;
use edge::domain::models::Budget;
use edge::domain::{Bytes, BytesError, Inventory, parse_bytes};

/// The share of its devices' memory an adapter's default budget leaves to everything else
/// on them (the driver and CUDA contexts on a GPU; the system and other processes in the
/// machine's memory).
pub const MARGIN_PERCENT: u64 = 10;

/// The setting that names an adapter's budget.
pub const MEMORY: &str = "memory";

/// The setting that names the devices an adapter's engine uses.
pub const DEVICES: &str = "devices";

/// Why an adapter's budget cannot be used: it is misconfigured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    /// `memory` is not a size.
    #[error("`memory`: {0}")]
    Memory(#[from] BytesError),
    /// `devices` is not a list of device indices.
    #[error("`devices` must list device indices, `0,1`, got {value:?}")]
    Devices {
        /// What was written.
        value: String,
    },
    /// `devices` names a device the node does not have.
    #[error("`devices` names device {index}, which this node does not have (it has {have:?})")]
    UnknownDevice {
        /// The index named.
        index: u32,
        /// The node's device indices.
        have: Vec<u32>,
    },
    /// The adapters using a device budget more than it has.
    #[error(
        "device {device} has {}, and the adapters using it ({adapters:?}) budget {} of it: \
         set `memory` on each so that they add up to no more",
        Bytes(*.total),
        Bytes(*.budgeted)
    )]
    OverBudget {
        /// The device.
        device: u32,
        /// The adapters using it.
        adapters: Vec<String>,
        /// What they budget of it together, in bytes.
        budgeted: u64,
        /// Its memory, in bytes.
        total: u64,
    },
}

/// An adapter's budget and the memory of the devices it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterBudget {
    /// Its budget (bytes, devices): what the node reports.
    pub budget: Budget,
    /// The memory of its devices, in bytes (a vLLM server's share is taken of it).
    pub device_bytes: u64,
}

/// One adapter's settings read against the node's devices: `None` when it has no budget.
fn one(
    adapter: &ReceivedAdapter,
    inventory: &Inventory,
) -> Result<Option<AdapterBudget>, BudgetError> {
    let settings = &adapter.settings;
    if !settings.contains_key("lifecycle") && !settings.contains_key(MEMORY) {
        return Ok(None);
    }
    let have: Vec<u32> = inventory.devices.iter().map(|d| d.index).collect();
    let devices = match settings.get(DEVICES) {
        None => have.clone(),
        Some(value) => {
            let parsed: Option<Vec<u32>> =
                value.split(',').map(|d| d.trim().parse().ok()).collect();
            let mut parsed =
                parsed
                    .filter(|list| !list.is_empty())
                    .ok_or_else(|| BudgetError::Devices {
                        value: value.clone(),
                    })?;
            parsed.sort_unstable();
            parsed.dedup();
            parsed
        }
    };
    if let Some(&index) = devices.iter().find(|index| !have.contains(index)) {
        return Err(BudgetError::UnknownDevice { index, have });
    }
    let device_bytes: u64 = devices
        .iter()
        .filter_map(|index| inventory.device(*index))
        .map(|d| d.total_bytes)
        .sum();
    let bytes = match settings.get(MEMORY) {
        Some(value) => parse_bytes(value)?,
        None => device_bytes - device_bytes * MARGIN_PERCENT / 100,
    };
    Ok(Some(AdapterBudget {
        budget: Budget { bytes, devices },
        device_bytes,
    }))
}

/// Every adapter's budget, by name (`Ok(None)`: it has none), with the adapters that over-
/// budget a device they share made misconfigured.
pub fn budgets(
    adapters: &[ReceivedAdapter],
    inventory: &Inventory,
) -> BTreeMap<String, Result<Option<AdapterBudget>, BudgetError>> {
    let mut found: BTreeMap<String, Result<Option<AdapterBudget>, BudgetError>> = adapters
        .iter()
        .map(|adapter| (adapter.name.clone(), one(adapter, inventory)))
        .collect();
    for device in &inventory.devices {
        let users: Vec<(&String, u64)> = found
            .iter()
            .filter_map(|(name, budget)| {
                let budget = budget.as_ref().ok()?.as_ref()?;
                budget
                    .budget
                    .devices
                    .contains(&device.index)
                    .then(|| (name, share(budget, device.total_bytes)))
            })
            .collect();
        let budgeted: u64 = users.iter().map(|(_, share)| share).sum();
        if budgeted <= device.total_bytes {
            continue;
        }
        let names: Vec<String> = users.iter().map(|(name, _)| (*name).clone()).collect();
        let error = BudgetError::OverBudget {
            device: device.index,
            adapters: names.clone(),
            budgeted,
            total: device.total_bytes,
        };
        for name in names {
            found.insert(name, Err(error.clone()));
        }
    }
    found
}

/// What `budget` takes of a device of `total` bytes: its budget spread over its devices in
/// proportion to their memory.
fn share(budget: &AdapterBudget, total: u64) -> u64 {
    let spread = u128::from(budget.budget.bytes) * u128::from(total)
        / u128::from(budget.device_bytes.max(1));
    u64::try_from(spread).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use edge::domain::{Device, DeviceKind};

    use super::*;

    const GIB: u64 = 1 << 30;

    fn gpus(sizes: &[u64]) -> Inventory {
        Inventory {
            devices: sizes
                .iter()
                .enumerate()
                .map(|(i, gib)| Device {
                    index: u32::try_from(i).unwrap(),
                    kind: DeviceKind::Gpu,
                    name: format!("gpu{i}"),
                    total_bytes: gib * GIB,
                    used_bytes: 0,
                })
                .collect(),
        }
    }

    fn adapter(name: &str, settings: &[(&str, &str)]) -> ReceivedAdapter {
        ReceivedAdapter {
            name: name.into(),
            targets: vec!["t".into()],
            settings: settings
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn budget_of(
        found: &BTreeMap<String, Result<Option<AdapterBudget>, BudgetError>>,
        name: &str,
    ) -> Option<Budget> {
        found[name].clone().expect("a budget").map(|b| b.budget)
    }

    #[test]
    fn the_default_is_every_device_less_the_margin() {
        let found = budgets(
            &[adapter("llama", &[("lifecycle", "llama-router")])],
            &gpus(&[24, 80]),
        );
        let budget = budget_of(&found, "llama").expect("managed");
        assert_eq!(budget.devices, [0, 1]);
        assert_eq!(budget.bytes, 104 * GIB - 104 * GIB / 10);
        // An adapter without a lifecycle or `memory` has none.
        let plain = budgets(&[adapter("echo", &[])], &gpus(&[24]));
        assert_eq!(budget_of(&plain, "echo"), None);
    }

    #[test]
    fn memory_and_devices_are_the_operators() {
        let settings = [
            ("lifecycle", "ollama"),
            ("memory", "20GiB"),
            ("devices", "1"),
        ];
        let found = budgets(&[adapter("ollama", &settings)], &gpus(&[24, 80]));
        let budget = budget_of(&found, "ollama").expect("managed");
        assert_eq!((budget.bytes, budget.devices), (20 * GIB, vec![1]));
        let bad = [
            adapter("a", &[("memory", "lots")]),
            adapter("b", &[("memory", "1GiB"), ("devices", "0,x")]),
            adapter("c", &[("memory", "1GiB"), ("devices", "7")]),
        ];
        let found = budgets(&bad, &gpus(&[24]));
        assert!(matches!(found["a"], Err(BudgetError::Memory(_))));
        assert!(matches!(found["b"], Err(BudgetError::Devices { .. })));
        assert!(matches!(
            found["c"],
            Err(BudgetError::UnknownDevice { index: 7, .. })
        ));
    }

    #[test]
    fn adapters_sharing_a_device_may_not_budget_more_than_it_has() {
        let gpu = gpus(&[24]);
        let fits = [
            adapter(
                "llama",
                &[("lifecycle", "llama-router"), ("memory", "16GiB")],
            ),
            adapter("vllm", &[("lifecycle", "vllm"), ("memory", "8GiB")]),
        ];
        assert!(budgets(&fits, &gpu).values().all(Result::is_ok));
        let over = [
            adapter(
                "llama",
                &[("lifecycle", "llama-router"), ("memory", "16GiB")],
            ),
            adapter("vllm", &[("lifecycle", "vllm"), ("memory", "9GiB")]),
            adapter("echo", &[]),
        ];
        let found = budgets(&over, &gpu);
        let error = found["llama"].clone().expect_err("over budget");
        assert_eq!(found["vllm"].clone().expect_err("over budget"), error);
        assert!(
            error.to_string().contains("device 0 has 24.00 GiB"),
            "{error}"
        );
        assert!(
            found["echo"].is_ok(),
            "an adapter without a budget is not in it"
        );
        // Two defaults on one device are each the whole device: too much together.
        let defaults = [
            adapter("a", &[("lifecycle", "llama-router")]),
            adapter("b", &[("lifecycle", "ollama")]),
        ];
        assert!(budgets(&defaults, &gpu).values().all(Result::is_err));
        // One alone may not budget more than its devices have either.
        let alone = budgets(&[adapter("a", &[("memory", "30GiB")])], &gpu);
        assert!(alone["a"].is_err());
    }
}
