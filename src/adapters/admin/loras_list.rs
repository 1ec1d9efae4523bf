//! `GET /admin/v1/loras`: every LoRA the edge knows from its nodes' reports (its base, the
//! weights of its first report, each connected node reporting it and whether it agrees),
//! and every conflict found since the edge started.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;
use super::views::ErrorBody;
use crate::domain::{ConflictKind, LoraConflict};
use crate::ports::LoraView;

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(list_loras))
}

/// `GET /admin/v1/loras`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoraList {
    /// Every LoRA known, ordered by model id.
    pub loras: Vec<LoraStateView>,
    /// Every LoRA a node reported that is not served from it, in the order found.
    pub conflicts: Vec<LoraConflictView>,
}

/// A LoRA the edge knows.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoraStateView {
    /// Its model id, `<adapter>/<lora>`.
    pub model: String,
    /// The model it is a fine-tune of, `<adapter>/<target>`.
    pub parent: String,
    /// Its weights' path, as its first report said.
    pub path: String,
    /// Their SHA-256, when that node could read them.
    pub sha256: Option<String>,
    /// The node that reported it first.
    pub first_node: String,
    /// Each connected node reporting it now.
    pub nodes: Vec<LoraOnNodeView>,
}

/// A LoRA on one connected node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoraOnNodeView {
    /// The node's id.
    pub node: String,
    /// `loaded` (its engine applies it at once) or `loadable` (the node registers it with
    /// its engine before the first run that asks for it).
    pub state: String,
    /// Whether its report agrees with the first one (same base, same weights): only then
    /// does the node serve it.
    pub agrees: bool,
}

/// A LoRA a node reported that the edge does not serve from it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LoraConflictView {
    /// Its model id, `<adapter>/<lora>`.
    pub model: String,
    /// The node that reported it.
    pub node: String,
    /// `named_like_a_target` (a configured target of the adapter has its name: the name is
    /// the target's) or `other_weights` (the edge knows the name with other weights or
    /// another base, from its first report).
    pub kind: String,
    /// With `other_weights`: the model the node says it is a fine-tune of.
    pub parent: Option<String>,
    /// With `other_weights`: the node's weights' path.
    pub path: Option<String>,
    /// With `other_weights`: their SHA-256, when the node read them.
    pub sha256: Option<String>,
}

/// Every LoRA the edge knows and every conflict found.
#[utoipa::path(
    get,
    path = "/admin/v1/loras",
    tag = "models",
    responses(
        (status = 200, description = "The LoRAs nodes reported since the edge started, and the conflicts", body = LoraList),
        (status = 401, description = "No valid admin key", body = ErrorBody),
    ),
    security(("admin_key" = []))
)]
async fn list_loras(State(state): State<AdminState>) -> Json<LoraList> {
    let Some(loras) = state.loras.as_ref() else {
        return Json(LoraList {
            loras: Vec::new(),
            conflicts: Vec::new(),
        });
    };
    let book = loras.book();
    Json(LoraList {
        loras: loras.listing().iter().map(LoraStateView::of).collect(),
        conflicts: book.conflicts().iter().map(LoraConflictView::of).collect(),
    })
}

impl LoraStateView {
    fn of(view: &LoraView) -> Self {
        Self {
            model: format!("{}/{}", view.adapter, view.name),
            parent: format!("{}/{}", view.adapter, view.known.base),
            path: view.known.file.path.clone(),
            sha256: view.known.file.sha256.clone(),
            first_node: view.known.first_node.to_string(),
            nodes: view
                .nodes
                .iter()
                .map(|on| LoraOnNodeView {
                    node: on.node.to_string(),
                    state: on.state.as_str().to_owned(),
                    agrees: on.agrees,
                })
                .collect(),
        }
    }
}

impl LoraConflictView {
    fn of(conflict: &LoraConflict) -> Self {
        let (parent, file) = match &conflict.kind {
            ConflictKind::NamedLikeTarget => (None, None),
            ConflictKind::OtherWeights { base, file } => {
                (Some(format!("{}/{base}", conflict.adapter)), Some(file))
            }
        };
        Self {
            model: format!("{}/{}", conflict.adapter, conflict.lora),
            node: conflict.node.to_string(),
            kind: conflict.kind.as_str().to_owned(),
            parent,
            path: file.map(|f| f.path.clone()),
            sha256: file.and_then(|f| f.sha256.clone()),
        }
    }
}
