//! Run events → the Responses API's typed stream: `response.created` and
//! `response.in_progress`; per output item `response.output_item.added`, its deltas
//! (`response.output_text.delta` after `response.content_part.added`,
//! `response.reasoning_text.delta`, `response.function_call_arguments.delta`), its `.done`
//! events and `response.output_item.done`; then exactly one of `response.completed`,
//! `response.incomplete` or `response.failed`, carrying the whole response. Every event has
//! a `sequence_number` counting from 0.
//!
//! A pure state machine. A message or reasoning item closes when another item starts; a
//! function call stays open until the end, so pieces of parallel calls may come in any
//! order and none is lost. A compaction's stream shows no text as it comes: its summary
//! is gathered and sent at the end as the one `compaction` item (added and done).

use serde_json::{Value, json};

use super::items::{
    Item, ItemState, Outcome, ResponseBase, call_id, compaction_item, response_json,
    terminal_event, text_part,
};
use crate::adapters::api::translators::ApiError;
use crate::adapters::api::translators::output::Finished;
use crate::adapters::api::translators::{ApiEvent, StreamTranslator};
use crate::domain::{StructuredOutput, ToolCallDelta, Usage};

/// The streaming state of one Responses answer.
#[derive(Debug)]
pub(in crate::adapters::api) struct ResponsesStream {
    base: ResponseBase,
    sequence: u64,
    /// Every output item so far, in output order, and whether it is done.
    items: Vec<(Item, bool)>,
    /// The open message or reasoning item (an index into `items`).
    open: Option<usize>,
    /// Function calls: (the node's call index, the item's index).
    calls: Vec<(u32, usize)>,
    /// A compaction's summary so far.
    summary: String,
    ended: bool,
}

impl ResponsesStream {
    /// The stream of the response `base` describes.
    pub(in crate::adapters::api) fn new(base: ResponseBase) -> Self {
        Self {
            base,
            sequence: 0,
            items: Vec::new(),
            open: None,
            calls: Vec::new(),
            summary: String::new(),
            ended: false,
        }
    }

    /// The response as it stands before its end: in progress, with its output so far.
    pub(in crate::adapters::api) fn snapshot(&self) -> Value {
        response_json(&self.base, &Outcome::InProgress, self.output_json(false))
    }

    /// Every output item so far, as JSON; when the response `failed`, the items it cut
    /// short are `incomplete`, with what they had.
    fn output_json(&self, failed: bool) -> Vec<Value> {
        let state = |done: bool| match (done, failed) {
            (true, _) => ItemState::Completed,
            (false, true) => ItemState::Incomplete,
            (false, false) => ItemState::InProgress,
        };
        self.items
            .iter()
            .map(|(item, done)| item.to_json(state(*done)))
            .collect()
    }

    fn event(&mut self, name: &'static str, mut data: Value) -> ApiEvent {
        data["type"] = Value::from(name);
        data["sequence_number"] = Value::from(self.sequence);
        self.sequence += 1;
        ApiEvent::new(name, data)
    }

    fn add_item(&mut self, item: Item, events: &mut Vec<ApiEvent>) -> usize {
        let index = self.items.len();
        let added = json!({ "output_index": index, "item": item.to_json(ItemState::InProgress) });
        self.items.push((item, false));
        let event = self.event("response.output_item.added", added);
        events.push(event);
        index
    }

    /// Closes the open message or reasoning item.
    fn close_open(&mut self, events: &mut Vec<ApiEvent>) {
        let Some(index) = self.open.take() else {
            return;
        };
        let (item, _) = self.items[index].clone();
        let id = item.id().to_owned();
        match &item {
            Item::Message { text, .. } => {
                let at = json!({ "item_id": id, "output_index": index, "content_index": 0 });
                let mut done = at.clone();
                done["text"] = Value::from(text.as_str());
                done["logprobs"] = json!([]);
                events.push(self.event("response.output_text.done", done));
                let mut part = at;
                part["part"] = text_part(text);
                events.push(self.event("response.content_part.done", part));
            }
            Item::Reasoning { text, .. } => {
                let done = json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text });
                events.push(self.event("response.reasoning_text.done", done));
            }
            Item::Call { .. } | Item::Compaction { .. } => {}
        }
        self.finish_item(index, events);
    }

    fn finish_item(&mut self, index: usize, events: &mut Vec<ApiEvent>) {
        self.items[index].1 = true;
        let item = self.items[index].0.to_json(ItemState::Completed);
        let done = json!({ "output_index": index, "item": item });
        let event = self.event("response.output_item.done", done);
        events.push(event);
    }

    /// Appends `delta` to the open message (`reasoning: false`) or reasoning item, opening
    /// one first if needed.
    fn append(&mut self, reasoning: bool, delta: &str, events: &mut Vec<ApiEvent>) {
        let open = self.open.filter(|index| {
            matches!(
                (&self.items[*index].0, reasoning),
                (Item::Reasoning { .. }, true) | (Item::Message { .. }, false)
            )
        });
        let index = match open {
            Some(index) => index,
            None => {
                self.close_open(events);
                let n = self.items.len();
                let item = if reasoning {
                    Item::Reasoning {
                        id: format!("rs_{}_{n}", self.base.id),
                        text: String::new(),
                    }
                } else {
                    Item::Message {
                        id: format!("msg_{}_{n}", self.base.id),
                        text: String::new(),
                    }
                };
                let index = self.add_item(item, events);
                if !reasoning {
                    let part = json!({
                        "item_id": self.items[index].0.id(), "output_index": index,
                        "content_index": 0, "part": text_part(""),
                    });
                    let event = self.event("response.content_part.added", part);
                    events.push(event);
                }
                self.open = Some(index);
                index
            }
        };
        let (Item::Message { id, text } | Item::Reasoning { id, text }) = &mut self.items[index].0
        else {
            return;
        };
        text.push_str(delta);
        let mut data =
            json!({ "item_id": id, "output_index": index, "content_index": 0, "delta": delta });
        let name = if reasoning {
            "response.reasoning_text.delta"
        } else {
            data["logprobs"] = json!([]);
            "response.output_text.delta"
        };
        let event = self.event(name, data);
        events.push(event);
    }

    fn tool_piece(&mut self, piece: &ToolCallDelta, events: &mut Vec<ApiEvent>) {
        let index = match self.calls.iter().find(|(call, _)| *call == piece.index) {
            Some((_, index)) => *index,
            None => {
                self.close_open(events);
                let id = format!("fc_{}_{}", self.base.id, self.items.len());
                let call_id = call_id(&self.base, &piece.id, piece.index);
                let item = self.base.call(id, call_id, &piece.name, String::new());
                let index = self.add_item(item, events);
                self.calls.push((piece.index, index));
                index
            }
        };
        if piece.arguments.is_empty() {
            return;
        }
        if let Item::Call { id, arguments, .. } = &mut self.items[index].0 {
            arguments.push_str(&piece.arguments);
            let data = json!({ "item_id": id, "output_index": index, "delta": piece.arguments });
            let event = self.event("response.function_call_arguments.delta", data);
            events.push(event);
        }
    }

    fn close_calls(&mut self, events: &mut Vec<ApiEvent>) {
        for (_, index) in std::mem::take(&mut self.calls) {
            if let Item::Call {
                id,
                name,
                arguments,
                ..
            } = &self.items[index].0
            {
                let done = json!({ "item_id": id, "output_index": index, "name": name, "arguments": arguments });
                let event = self.event("response.function_call_arguments.done", done);
                events.push(event);
            }
            self.finish_item(index, events);
        }
    }
}

impl StreamTranslator for ResponsesStream {
    fn open(&mut self, _counts: Option<Usage>) -> Vec<ApiEvent> {
        let response = response_json(&self.base, &Outcome::InProgress, Vec::new());
        let created = self.event("response.created", json!({ "response": response.clone() }));
        let in_progress = self.event("response.in_progress", json!({ "response": response }));
        vec![created, in_progress]
    }

    fn output(&mut self, text: &str, structured: Option<&StructuredOutput>) -> Vec<ApiEvent> {
        let mut events = Vec::new();
        if self.ended {
            return events;
        }
        if self.base.compaction {
            self.summary.push_str(text);
            return events;
        }
        if let Some(structured) = structured.filter(|s| !s.reasoning.is_empty()) {
            self.append(true, &structured.reasoning, &mut events);
        }
        if !text.is_empty() {
            self.append(false, text, &mut events);
        }
        for piece in structured.map_or(&[][..], |s| &s.tool_calls) {
            self.tool_piece(piece, &mut events);
        }
        events
    }

    fn close(&mut self, end: Result<&Finished, &ApiError>) -> Vec<ApiEvent> {
        let mut events = Vec::new();
        if std::mem::replace(&mut self.ended, true) {
            return events;
        }
        let outcome = match end {
            Ok(finished) => {
                self.close_open(&mut events);
                self.close_calls(&mut events);
                if self.base.compaction {
                    let item = compaction_item(&self.base, &self.summary);
                    let index = self.add_item(item, &mut events);
                    self.finish_item(index, &mut events);
                }
                Outcome::Finished(finished)
            }
            Err(error) => Outcome::Failed(error),
        };
        let output = self.output_json(end.is_err());
        let response = response_json(&self.base, &outcome, output);
        let event = self.event(terminal_event(&outcome), json!({ "response": response }));
        events.push(event);
        events
    }
}
