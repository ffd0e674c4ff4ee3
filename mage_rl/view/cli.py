"""The ``mage view`` sub-command: write the page of run folders, then serve it locally."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _cmd_view(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn

    from mage_rl.console import notice
    from mage_rl.view.build import build_site

    out = Path(args.out) if args.out else Path(args.runs[0]) / "view"
    with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                  disable=args.no_progress) as progress:  # fmt: skip
        task = progress.add_task("reading meta-episodes: 0")
        seen = [0]

        def tick() -> None:
            seen[0] += 1
            if seen[0] % 200 == 0:
                progress.update(task, description=f"reading meta-episodes: {seen[0]}")

        built = build_site(args.runs, out, on_meta_episode=tick)
    notice("wrote", f" {built['index']} ({built['meta_episodes']} meta-episodes); it opens "
           "from the file as well, without a server", style="green")  # fmt: skip
    if args.no_serve:
        return 0
    return serve_folder(out, args.host, args.port)


def folder_server(folder: Path, host: str = "127.0.0.1", port: int = 0) -> Any:
    """An HTTP server of the static files in ``folder`` (not started)."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug(format, *args)

    handler = functools.partial(Quiet, directory=str(folder))
    return ThreadingHTTPServer((host, port), handler)


def serve_folder(folder: Path, host: str, port: int) -> int:
    """Serve ``folder`` over HTTP until Ctrl-C (static files only)."""
    from mage_rl.console import notice

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(
            "serving on %s: anyone who reaches it reads the runs' prompts and answers", host
        )
    with folder_server(folder, host, port) as server:
        notice("serving", f" http://{host}:{server.server_address[1]}/ (Ctrl-C stops)",
               style="green")  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``view`` to the ``mage`` sub-command parser."""
    p = sub.add_parser(
        "view",
        help="a local web page of training runs and evaluations, call by call",
        description="Write a web page of RUN folders (training runs of mage train, "
        "evaluations of mage eval): learning curves and evaluation results with "
        "intervals and exact values, the answers by decision state, and every "
        "meta-episode call by call with its prompt, response, token log-probs and credit "
        "(return, A_E, A_S, advantage; from the training samples). The page is a static "
        "folder (default RUN/view) that opens from the file too; it is then served on "
        "127.0.0.1 until Ctrl-C.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where to write the page (default: the first RUN/view)",
    )
    p.add_argument("--no-serve", action="store_true", help="write the page and exit")
    p.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: loopback only)"
    )
    p.add_argument("--port", type=int, default=8765, help="port (0: a free one)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=_cmd_view)
