"""The console's pages, one module per group: sign-in (:mod:`.sign_in`), datasets ->
versions -> shards (:mod:`.datasets`), runs (:mod:`.runs`), tokens (:mod:`.tokens`), in
the frame every page shares (:mod:`.site`).

Each page resolves the session cookie to its token (:mod:`.session_store`) and reads
through the same data functions and use cases, with the same rights checks, as the JSON
API; pages hold no SQL of their own. Pages are bounded like API pages: lists are paged
(at most :data:`.site.PAGE` rows), a run's chart shows its last
:data:`.runs.CHART_POINTS` checkpoints.
"""

from __future__ import annotations

from typing import Any

from shardstream.server.console import datasets, runs, sign_in, tokens
from shardstream.server.console.site import SignInError, handle_sign_in

GROUPS = (sign_in, datasets, runs, tokens)
"""The console's page groups, each with its own router."""


def install(app: Any) -> None:
    """Add the console to ``app``: its routes and its sign-in redirect."""
    for group in GROUPS:
        app.include_router(group.router)
    app.add_exception_handler(SignInError, handle_sign_in)
