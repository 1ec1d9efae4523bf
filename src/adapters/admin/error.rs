//! The management API's errors: a status and `{"error": {"code", "message"}}`.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::views::{ErrorBody, ErrorDetail};
use crate::ports::{JournalError, ManageError, ModelCommandError};

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl AdminError {
    /// `400 bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// `401 unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// `404 not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// `503 models_unavailable`: this edge answers the model routes without a model
    /// lifecycle.
    pub fn models_unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "models_unavailable",
            "this edge has no model lifecycle to load or unload models",
        )
    }

    /// `503 standby`: this edge is a standby member of its site and changes nothing; the
    /// active member's management API is the one to call (`active`: its edge id and API
    /// address, when known).
    pub fn standby(active: Option<(&str, &str)>) -> Self {
        let message = match active {
            Some((edge, api)) => format!(
                "this edge is a standby member of its site; the active member is edge {edge} \
                 (api {api}): make changes there"
            ),
            None => "this edge is a standby member of its site and no active member is known yet"
                .to_owned(),
        };
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "standby", message)
    }

    /// `503 standby` for a run a standby member's journal does not hold: that journal
    /// follows the site's stream (and is rebuilt from it while the member takes over), so
    /// the run may be in the stream and not yet here; the active member knows (`active`:
    /// its edge id and API address, when known).
    pub fn run_not_yet_here(run: &str, active: Option<(&str, &str)>) -> Self {
        let ask = match active {
            Some((edge, api)) => format!("the active member, edge {edge} (api {api}), knows"),
            None => "no active member is known yet".to_owned(),
        };
        let message = format!(
            "no run has id {run:?} in this standby member's copy of the site's journal, \
             which may not have it yet; {ask}"
        );
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "standby", message)
    }

    /// `500 internal`: something that should not happen did.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// The status (the tests' view of an error; the server renders it whole).
    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl From<ManageError> for AdminError {
    fn from(error: ManageError) -> Self {
        let message = error.to_string();
        match error {
            ManageError::UnknownNode(_) | ManageError::UnknownRun(_) => Self::not_found(message),
            ManageError::RunEnded(_) => Self::new(StatusCode::CONFLICT, "run_ended", message),
            ManageError::JournalDisabled => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "journal_disabled", message)
            }
            ManageError::Journal(JournalError::Unavailable(_)) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "journal_unavailable",
                message,
            ),
            ManageError::Journal(JournalError::Damaged(_)) => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "journal_damaged",
                message,
            ),
        }
    }
}

impl From<ModelCommandError> for AdminError {
    fn from(error: ModelCommandError) -> Self {
        let message = error.to_string();
        match error {
            ModelCommandError::UnknownNode(_) => Self::not_found(message),
            ModelCommandError::NotManaged { .. } => {
                Self::new(StatusCode::CONFLICT, "not_managed", message)
            }
            ModelCommandError::Conflict(_) => Self::new(StatusCode::CONFLICT, "conflict", message),
            ModelCommandError::Failed(_) => {
                Self::new(StatusCode::BAD_GATEWAY, "model_command_failed", message)
            }
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let retry = self.code == "standby";
        let mut response = (self.status, Json(body)).into_response();
        if retry {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"edge admin\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_journal_is_unavailable_and_a_damaged_one_is_a_server_error() {
        let busy = AdminError::from(ManageError::Journal(JournalError::Unavailable(
            "database is locked".into(),
        )));
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.code, "journal_unavailable");
        let damaged = AdminError::from(ManageError::Journal(JournalError::Damaged(
            "events \"\\u{0}\"".into(),
        )));
        assert_eq!(damaged.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(damaged.code, "journal_damaged");
    }

    #[test]
    fn model_command_errors_map_to_their_statuses_and_codes() {
        let cases = [
            (
                ModelCommandError::UnknownNode("gpu-z".into()),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                ModelCommandError::NotManaged {
                    node: "node-a".into(),
                    model: "echo/default".into(),
                    why: "no".into(),
                },
                StatusCode::CONFLICT,
                "not_managed",
            ),
            (
                ModelCommandError::Conflict("pinned".into()),
                StatusCode::CONFLICT,
                "conflict",
            ),
            (
                ModelCommandError::Failed("out of memory".into()),
                StatusCode::BAD_GATEWAY,
                "model_command_failed",
            ),
        ];
        for (error, status, code) in cases {
            let message = error.to_string();
            let answer = AdminError::from(error);
            assert_eq!((answer.status(), answer.code), (status, code));
            assert_eq!(answer.message, message);
        }
    }
}
