"""Resumes a background Responses stream with the official `openai` Python package.

Usage: responses_resume.py HTTP_BASE RESPONSE_ID LAST_SEEN SEEN_TEXT EXPECTED_TEXT

The caller read the stream of RESPONSE_ID up to sequence number LAST_SEEN (its text so far
SEEN_TEXT) before its connection died; `responses.retrieve(id, stream=True,
starting_after=LAST_SEEN)` must give every later event once, numbered on from LAST_SEEN,
ending `response.completed`, with SEEN_TEXT plus the rest equal to EXPECTED_TEXT; then
`retrieve(id)` must say completed with that text. Prints `ok` and exits 0 only
if every check holds. Started by tests/it/readopt.rs.
"""

import sys

from openai import OpenAI

from sdk_support import check


def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    base, response_id, last_seen, seen, expected = sys.argv[1:]
    last_seen = int(last_seen)
    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=last_seen))
    numbers = [e.sequence_number for e in rest]
    check(numbers == list(range(last_seen + 1, last_seen + 1 + len(rest))), f"numbers: {numbers}")
    check(rest[-1].type == "response.completed", f"end: {rest[-1]}")
    text = seen + "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    check(text == expected, f"{text!r} != {expected!r}")
    done = client.responses.retrieve(response_id)
    check(done.status == "completed", f"retrieved: {done.status}")
    check(done.output_text == expected, f"retrieved text: {done.output_text!r}")
    print(f"ok: resumed {response_id} after {last_seen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
