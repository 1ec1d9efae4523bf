"""What the SDK client scripts share: a check that fails with a message, their
`HTTP_BASE API_KEY` arguments and `openai` client, and reading a streamed chat or text completion into its
text, finish reason, usage and chunk count."""

import sys

from openai import OpenAI


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def openai_from_args(usage):
    """The script's `HTTP_BASE API_KEY` arguments and an `openai` client of them (no
    retries); `None` (after printing `usage`) when the arguments are not two."""
    if len(sys.argv) != 3:
        print(usage, file=sys.stderr)
        return None
    base, key = sys.argv[1], sys.argv[2]
    return base, key, OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=30)


def chat_piece(choice):
    """The text a streamed chat choice adds."""
    return choice.delta.content or ""


def text_piece(choice):
    """The text a streamed text-completion choice adds."""
    return choice.text


def read_stream(stream, piece, each_chunk=None):
    """Reads `stream` to its end: the text its choices add (`piece` reads one choice), the
    last finish reason, the usage chunk's usage, and how many chunks came; `each_chunk`, if
    given, checks every chunk."""
    text, finish, usage, chunks = "", None, None, 0
    for chunk in stream:
        chunks += 1
        if each_chunk is not None:
            each_chunk(chunk)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += piece(choice)
            finish = choice.finish_reason or finish
    return text, finish, usage, chunks
