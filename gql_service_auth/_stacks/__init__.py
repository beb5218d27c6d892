"""The adapters' private half: each names its stack and does the I/O.

- ``aiohttp``, ``aiohttp_redact``, ``aiohttp_token_session``, ``aiohttp_token_post``: gql's
  aiohttp transport's plumbing (sessions per event loop, uploads per task, fork orphans),
  where aiohttp's errors keep their records, and the token request's own aiohttp session
  and post (aiohttp imported at the first post);
- ``options``: the token's keywords, declared once for every OAuth2 class, and the one
  builder that checks them;
- ``requests_auth``, ``httpx_auth``: the auth hook for requests and the ``httpx.Auth`` flow;
- ``auth_objects``, ``stack_transports``, ``http_auth``: what the requests and httpx
  adapters share (the auth objects' settings, ``from_env``, the rules of a signed request);
- ``gql``: the glue every gql transport shares, whatever its stack.

The public modules (``transports``, ``requests``, ``httpx``) keep their import paths.
"""
