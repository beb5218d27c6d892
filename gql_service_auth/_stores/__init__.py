"""The shared second level under each process's tokens, and what its stores share.

- ``protocol``: the :class:`~gql_service_auth.TokenStore` protocol, the identity and token a
  store keeps, and the life cycle of a store on a loop thread of its own (its calls bounded
  by ``connect_timeout`` to be ready, then ``timeout``);
- ``level``: where a token manager's tokens come from, the token endpoint or a store in
  front of it (``SharedLevel``: read, or lock, fetch and write);
- ``sealed``: the keys, names and encryption of stored values, from the client secret;
- ``local_db``: the SQLite of :class:`~gql_service_auth.local.LocalTokenStore`;
- ``redis_clients``, ``redis_faults``, ``redis_keys``, ``redis_scripts``: the clients of each
  Redis URL form, which errors heal, the key names and the Lua scripts of
  :class:`~gql_service_auth.redis.RedisTokenStore`.

The public stores (``gql_service_auth.local``, ``gql_service_auth.redis``) keep their
import paths; nothing here imports an HTTP stack or a gql transport.
"""
