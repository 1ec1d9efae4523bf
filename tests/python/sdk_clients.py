"""Drives a running edge with the official `openai` and `anthropic` Python packages.

Usage: sdk_clients.py HTTP_BASE API_KEY

HTTP_BASE is the edge's HTTP address (http://127.0.0.1:PORT). The edge must have the mock
node of tests/api_support (targets named after its behaviours: default, reasoning, tools,
logprobs, length, bad_request, node_error, ...) and API_KEY among `[api] keys`. Covers
embeddings (float and base64), Responses (whole, streamed, function calls), chat tool calls
and reasoning (whole and streamed), Anthropic Messages (whole, streamed, tool use round
trip, thinking) and both SDKs' exception types. Prints `ok` and exits 0 only if every check
holds. Started by tests/api_sdks.rs.
"""

import base64
import struct
import sys

import anthropic
import openai

from sdk_support import check, openai_from_args

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}},
]
RESPONSE_TOOLS = [
    {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
    {"type": "function", "name": "clock", "parameters": {"type": "object"}},
]
ANTHROPIC_TOOLS = [
    {"name": "lookup", "description": "finds", "input_schema": {"type": "object"}},
    {"name": "clock", "input_schema": {"type": "object"}},
]


def close(a, b):
    return abs(a - b) < 1e-5


def expect(error_type, call, what):
    try:
        call()
    except error_type as error:
        return error
    raise AssertionError(f"{what}: no {error_type.__name__}")


def embeddings(client):
    floats = client.embeddings.create(
        model="echo/default", input=["ab", "cde"], dimensions=3, encoding_format="float"
    )
    check(len(floats.data) == 2, f"embeddings: {floats}")
    vector = floats.data[0].embedding
    check(len(vector) == 3 and close(vector[0], 2.01) and close(vector[2], 0.03), f"float vector: {vector}")
    check(floats.usage.prompt_tokens == 5, f"usage: {floats.usage}")

    # The SDK asks for base64 by default and decodes it itself.
    default = client.embeddings.create(model="echo/default", input="abcd")
    vector = default.data[0].embedding
    check(len(vector) == 8 and close(vector[0], 4.01) and close(vector[7], 0.08), f"base64 vector: {vector}")

    raw = client.embeddings.create(model="echo/default", input="abcd", encoding_format="base64")
    text = raw.data[0].embedding
    check(isinstance(text, str), f"explicit base64 stays text: {text!r}")
    decoded = struct.unpack("<8f", base64.b64decode(text))
    check(close(decoded[0], 4.01), f"decoded: {decoded}")


def responses(client):
    whole = client.responses.create(model="echo/default", input="hello there", instructions="you echo")
    check(whole.status == "completed", f"status: {whole.status}")
    check(whole.output_text == "hello there", f"output_text: {whole.output_text!r}")
    check(whole.usage.total_tokens == 4, f"usage: {whole.usage}")

    kinds, text = [], ""
    for event in client.responses.create(model="echo/reasoning", input="one two", stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
    check(kinds[0] == "response.created" and kinds[-1] == "response.completed", f"events: {kinds}")
    check("response.reasoning_text.delta" in kinds, f"no reasoning: {kinds}")
    check(text == "one two", f"streamed text: {text!r}")

    with client.responses.stream(model="echo/default", input="via the helper") as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    check(final.output_text == "via the helper", f"helper: {final.output_text!r}")

    calls = client.responses.create(model="echo/tools", input="Oslo", tools=RESPONSE_TOOLS)
    items = [item for item in calls.output if item.type == "function_call"]
    check([i.name for i in items] == ["lookup", "clock"], f"calls: {calls.output}")
    check(items[0].arguments == '{"city": "Oslo0"}', f"arguments: {items[0].arguments}")
    follow = [{"role": "user", "content": "Oslo"}] + [i.model_dump() for i in items] + [
        {"type": "function_call_output", "call_id": items[0].call_id, "output": "sunny"},
        {"type": "function_call_output", "call_id": items[1].call_id, "output": "noon"},
    ]
    answer = client.responses.create(model="echo/tools", input=follow, tools=RESPONSE_TOOLS)
    check(answer.output_text == "the tools said: sunny and noon", f"round trip: {answer.output_text!r}")

    with client.responses.stream(model="echo/tools", input="Oslo", tools=RESPONSE_TOOLS) as stream:
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    check(streamed[1].arguments == '{"city": "Oslo1"}', f"streamed calls: {final.output}")

    error = expect(openai.BadRequestError, lambda: client.responses.create(
        model="echo/default", input="x", previous_response_id="resp_1"), "previous_response_id")
    check("previous_response_id" in str(error), f"names the field: {error}")


def chat(client):
    whole = client.chat.completions.create(
        model="echo/tools", messages=[{"role": "user", "content": "Oslo"}], tools=TOOLS
    )
    choice = whole.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish: {choice.finish_reason}")
    check(choice.message.content is None, f"content: {choice.message.content!r}")
    calls = choice.message.tool_calls
    check([c.function.name for c in calls] == ["lookup", "clock"], f"calls: {calls}")
    check(calls[1].function.arguments == '{"city": "Oslo1"}', f"arguments: {calls[1]}")

    pieces, finish = {}, None
    for chunk in client.chat.completions.create(
        model="echo/tools", messages=[{"role": "user", "content": "Oslo"}], tools=TOOLS, stream=True
    ):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                entry = pieces.setdefault(call.index, {"name": "", "arguments": ""})
                if call.function and call.function.name:
                    entry["name"] = call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
    check(pieces[0] == {"name": "lookup", "arguments": '{"city": "Oslo0"}'}, f"streamed: {pieces}")
    check(finish == "tool_calls", f"streamed finish: {finish}")

    thought = client.chat.completions.create(
        model="echo/reasoning", messages=[{"role": "user", "content": "hi"}]
    )
    message = thought.choices[0].message
    check(getattr(message, "reasoning_content", None) == "thinking about it", f"reasoning: {message}")
    check(thought.usage.completion_tokens_details.reasoning_tokens == 3, f"usage: {thought.usage}")
    check(thought.usage.prompt_tokens_details.cached_tokens == 1, f"usage: {thought.usage}")

    error = expect(openai.BadRequestError, lambda: client.chat.completions.create(
        model="echo/bad_request", messages=[{"role": "user", "content": "x"}]), "bad request")
    check(error.code == "context_length_exceeded", f"code: {error.code}")
    check("maximum context length" in error.message, f"message: {error.message}")
    expect(openai.InternalServerError, lambda: client.chat.completions.create(
        model="echo/node_error", messages=[{"role": "user", "content": "x"}]), "node error")


def messages(client):
    whole = client.messages.create(
        model="echo/default", max_tokens=64, system="you echo",
        messages=[{"role": "user", "content": "hello from anthropic"}],
    )
    check(whole.content[0].type == "text" and whole.content[0].text == "hello from anthropic", f"{whole}")
    check(whole.stop_reason == "end_turn", f"stop: {whole.stop_reason}")
    check((whole.usage.input_tokens, whole.usage.output_tokens) == (3, 3), f"usage: {whole.usage}")

    with client.messages.stream(
        model="echo/default", max_tokens=64, messages=[{"role": "user", "content": "streamed words arrive"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(text == "streamed words arrive", f"text_stream: {text!r}")
    check(final.stop_reason == "end_turn" and final.usage.output_tokens == 3, f"final: {final}")

    ask = [{"role": "user", "content": "Oslo"}]
    called = client.messages.create(model="echo/tools", max_tokens=64, messages=ask, tools=ANTHROPIC_TOOLS)
    check(called.stop_reason == "tool_use", f"stop: {called.stop_reason}")
    uses = [block for block in called.content if block.type == "tool_use"]
    check([u.name for u in uses] == ["lookup", "clock"], f"tool_use: {called.content}")
    check(uses[0].input == {"city": "Oslo0"}, f"input: {uses[0].input}")
    results = [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"},
        {"type": "tool_result", "tool_use_id": uses[1].id, "content": [{"type": "text", "text": "noon"}]},
    ]
    answer = client.messages.create(
        model="echo/tools", max_tokens=64, tools=ANTHROPIC_TOOLS,
        messages=ask + [{"role": "assistant", "content": called.content}, {"role": "user", "content": results}],
    )
    check(answer.content[0].text == "the tools said: sunny and noon", f"round trip: {answer.content}")

    with client.messages.stream(model="echo/tools", max_tokens=64, messages=ask, tools=ANTHROPIC_TOOLS) as stream:
        final = stream.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    check([b.input for b in streamed] == [{"city": "Oslo0"}, {"city": "Oslo1"}], f"streamed: {final.content}")
    check(final.stop_reason == "tool_use", f"streamed stop: {final.stop_reason}")

    thought = client.messages.create(
        model="echo/reasoning", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "hi"}],
    )
    check(thought.content[0].type == "thinking" and thought.content[0].thinking == "thinking about it", f"{thought}")


def anthropic_errors(base, key):
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30)
    ask = [{"role": "user", "content": "x"}]
    error = expect(anthropic.BadRequestError, lambda: client.messages.create(
        model="echo/bad_request", max_tokens=8, messages=ask), "bad request")
    check("maximum context length" in str(error), f"message: {error}")
    check(error.body["error"]["type"] == "invalid_request_error", f"body: {error.body}")
    expect(anthropic.BadRequestError, lambda: client.messages.create(
        model="echo/default", max_tokens=8, messages=[]), "empty messages")
    expect(anthropic.NotFoundError, lambda: client.messages.create(
        model="nothing/serves-this", max_tokens=8, messages=ask), "unknown model")
    expect(anthropic.InternalServerError, lambda: client.messages.create(
        model="echo/node_error", max_tokens=8, messages=ask), "node error")
    wrong = anthropic.Anthropic(base_url=base, api_key="sk-wrong", max_retries=0)
    expect(anthropic.AuthenticationError, lambda: wrong.messages.create(
        model="echo/default", max_tokens=8, messages=ask), "wrong key")


def main():
    args = openai_from_args(__doc__)
    if args is None:
        return 2
    base, key, client = args
    embeddings(client)
    responses(client)
    chat(client)
    messages(anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=30))
    anthropic_errors(base, key)
    print(f"ok: openai {openai.__version__}, anthropic {anthropic.__version__} drove the edge at {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
