//! The application layer: the services — the run service (`runs`), the model lifecycle
//! (`models`), the LoRAs known from the nodes' reports (`loras`), the management service
//! (`management`), the operator's drains (`drains`) and a site member's takeover
//! (`takeover`), which build on the domain and the ports only — and the composition root
//! (`compose`), which builds the adapters and wires them to the services.

pub mod compose;
pub(crate) mod drains;
pub mod loras;
pub(crate) mod management;
pub mod models;
pub mod node_events;
pub mod runs;
pub(crate) mod takeover;
