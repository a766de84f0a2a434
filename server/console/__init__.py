"""The web console at ``/ui``: datasets, versions, shards, runs and tokens for people.

Server-side pages (Jinja2 templates, no JavaScript, no CDN: nodes are often offline) served
by the same process and with the same tokens as the API. A person signs in with a token;
the session is that token in an HttpOnly, SameSite=Strict cookie scoped to ``/ui`` (Secure
behind TLS), checked on every request exactly like a bearer token, so revoking the token
ends the session at once. Every form carries a CSRF token derived from the session
(:mod:`.session`). What a token cannot read does not appear: the pages use the same
queries and rights checks as the API (:mod:`shardstream.server.data`).
"""
