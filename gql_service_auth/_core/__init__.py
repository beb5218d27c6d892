"""The core: what decides and keeps tokens, knowing no HTTP stack and no gql transport.

- ``refusal``: is an answer a refusal of the credentials, and may the request go again;
- ``flow``: the bounded renew-and-resend loop, as commands, and its two drivers;
- ``token``, ``tokens``, ``ledger``, ``flight``: the token and its lifetime rule, the token
  manager (one fetch for all callers, renewal ahead of expiry), what refusals and failed
  renewals said, a fetch in progress;
- ``oauth2``, ``credentials``, ``settings``, ``sharing``: the client-credentials grant, the
  credentials (never shown), an OAuth2 transport's checked settings, which transports of
  a process share one token manager;
- ``redact``, ``errors``, ``events``, ``telemetry``: secrets kept out of errors, the error
  tree, events and log records, OpenTelemetry;
- ``provenance``, ``config``, ``constants``, ``fork``, ``loop_thread``: where a stored token
  came from, environment and URL checks, the defaults, fork handling, the loop thread.

``tests/test_architecture.py`` imports each of them with aiohttp, httpx, requests and
gql's HTTP transports blocked.
"""
