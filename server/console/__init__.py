"""The web console at ``/ui``: datasets, versions, shards, runs and tokens for people.

Server-side pages (Jinja2 templates, no JavaScript, no CDN: nodes are often offline) served
by the same process and with the same tokens as the API. A person signs in with a token,
which opens a server-side session (:mod:`.session_store`): the cookie holds a random
session id, HttpOnly, SameSite=Strict, scoped to ``/ui`` (Secure behind TLS), never the
token, and never accepted by the API. Sign-out, the token's revocation or expiry, and the
session's own expiry and idle timeout end it. Every form carries a CSRF token derived
from the session (:mod:`.session`). What a token cannot read does not appear: the pages
use the same queries and rights checks as the API (:mod:`shardstream.server.data`).
"""
