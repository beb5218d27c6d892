"""``python -m gql_service_auth``: the same as the ``gql-service-auth`` command."""

import sys

from .cli import main

sys.exit(main())
