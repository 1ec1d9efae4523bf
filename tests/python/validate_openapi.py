"""Validates an OpenAPI document with openapi-spec-validator; exits non-zero if invalid.

Usage: validate_openapi.py PATH
"""

import json
import sys

from openapi_spec_validator import validate


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as handle:
        document = json.load(handle)
    validate(document)
    print(f"valid OpenAPI {document.get('openapi')} document: {len(document['paths'])} paths")
    return 0


if __name__ == "__main__":
    sys.exit(main())
