"""`fedresearch`: serve, ingest, ask, and manage the library from a terminal."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from fedresearch.core.errors import FailureKind
from fedresearch.core.settings import Settings
from fedresearch.report.types import offered_forms


def _serve(args: argparse.Namespace) -> int:
    if args.as_worker is not None:
        from fedresearch.serve.process import serve_worker

        serve_worker(Settings(), args.host, args.port, args.as_worker, args.listen_fd, args.ready_fd)
        return 0
    from fedresearch.serve.launch import serve

    settings = Settings()
    try:
        serve(settings, host=args.host, port=args.port, workers=args.workers, balance=args.balance)
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        where = f"{args.host or settings.host}:{settings.port if args.port is None else args.port}"
        print(
            f"fedresearch: {where} is in use (another server?): stop it, or serve on another port with "
            "--port or FEDRESEARCH_PORT",
            file=sys.stderr,
        )
        return 1
    return 0


def _worker_count(text: str) -> int | Literal["auto"]:
    """`--workers`: read as FEDRESEARCH_WORKERS is (a number, or auto)."""
    try:
        return Settings(FEDRESEARCH_WORKERS=text).workers
    except ValidationError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes (1 or more) or 'auto'") from None


def _mcp(args: argparse.Namespace) -> int:
    import logging

    from fedresearch.serve.process import serve_mcp_stdio

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)  # stdout carries the protocol
    asyncio.run(serve_mcp_stdio(Settings()))
    return 0


class _PassageCount:
    """The passages embedded so far, shown beside the ingest's progress bar."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.count = 0

    def add(self, count: int) -> None:
        self.count += count
        self.bar.set_postfix(passages=self.count)


def _ingest(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedresearch.core.models import checked_user_id
    from fedresearch.library.ingest import ingest, walk
    from fedresearch.library.locking import IndexBusy
    from fedresearch.library.open import open_library
    from fedresearch.library.store import LibraryUnavailable

    try:
        user = checked_user_id(args.user)
    except ValueError as error:  # a library no request could reach: refused, as the server refuses it
        print(f"fedresearch: --user: {error}", file=sys.stderr)
        return EXIT_CODES[FailureKind.bad_request]
    settings = Settings()
    library = open_library(settings)
    paths = [Path(p) for p in args.paths]
    total = sum(1 for _ in walk(paths))
    try:
        with tqdm(total=total, unit="file", desc="ingest", file=sys.stderr, disable=None) as bar:
            passages = _PassageCount(bar)
            report = ingest(
                library,
                user,
                paths,
                kind=args.type,
                on_file=lambda _: bar.update(),
                on_progress=passages.add,
                max_bytes=int(settings.ingest_max_file_mb * 1e6),
            )
    except (IndexBusy, LibraryUnavailable) as busy:
        print(f"ingest stopped after {bar.n} of {total} files: {busy}", file=sys.stderr)
        return 75  # EX_TEMPFAIL: try again later
    print(
        f"{report.files} files: {report.added} documents added, {report.replaced} replaced, "
        f"{report.unchanged} unchanged, {len(report.skipped)} skipped"
    )
    print(f"into {user}'s library in {settings.library_display}", file=sys.stderr)
    if hint := settings.left_behind():
        print(f"fedresearch: {hint}", file=sys.stderr)
    for reason in report.skipped:
        print(f"  skipped {reason}")
    return 1 if report.skipped and not (report.added or report.replaced or report.unchanged) else 0


def _library(args: argparse.Namespace) -> int:
    from fedresearch.library.facade import Library

    if args.action == "migrate":
        try:
            from fedresearch.library.migrate import migrate_command
        except ModuleNotFoundError as error:  # psycopg: the optional `postgres` extra
            print(f'migrating needs the postgres extra: pip install "fedresearch[postgres]" ({error})', file=sys.stderr)
            return 2

        settings = Settings()
        target = args.to or (settings.library_url.get_secret_value() if settings.library_url else "")
        if not target:
            print("name the PostgreSQL library: FEDRESEARCH_LIBRARY_URL (or --to)", file=sys.stderr)
            return 2
        return migrate_command(settings, target)
    library = Library(Settings().library_location)  # listing and deleting need no embedding model
    if args.action == "check":
        print(library.health())
        return 0
    if args.action == "list":
        documents = library.list_documents(args.user)
        for doc in documents:
            print(f"{doc.id:>6}  {doc.kind:<9}  {doc.chunks:>4} chunks  {doc.title[:70]}")
        print(f"{len(documents)} documents for {args.user}")
        return 0
    missing = [i for i in args.ids if not library.delete_document(args.user, i)]
    for document_id in missing:
        print(f"no document {document_id} for {args.user}", file=sys.stderr)
    return 1 if missing else 0


# what a script running `fedresearch ask` can tell apart (1: the server could not be reached)
EXIT_CODES = {
    FailureKind.bad_request: 2,
    FailureKind.too_many_tasks: 3,
    FailureKind.stopping: 4,
    FailureKind.timed_out: 5,
    FailureKind.internal: 6,
}
UNREACHABLE = 1


def _task_of(args: argparse.Namespace) -> dict[str, Any]:
    """The task as a client sends it in a `start` frame."""
    headers = {"retrievers": args.retrievers, "user_id": args.user, "internal_api_type": args.type}
    task: dict[str, Any] = {
        "task": args.question,
        "report_type": args.report_type,
        "headers": {name: value for name, value in headers.items() if value},
    }
    for name in ("report_source", "language", "tone"):
        if getattr(args, name):
            task[name] = getattr(args, name)
    return task


class _Follower:
    """A task's frames as the terminal shows them: progress and errors on stderr, the report gathered
    for stdout, the files of its last frame, and why it did not run, should it not."""

    def __init__(self) -> None:
        self.report: list[str] = []
        self.files: dict[str, str] | None = None  # set by `path`, the task's last frame
        self.failed: FailureKind | None = None

    @property
    def done(self) -> bool:
        return self.files is not None or (self.failed is not None and not self._then_report)

    def take(self, frame: dict[str, Any]) -> None:
        kind, metadata = frame.get("type"), frame.get("metadata") or {}
        if kind == "error":
            print(f"fedresearch: {frame.get('output', '')}", file=sys.stderr)
        elif kind == "logs" and frame.get("content") == "error":  # the error's twin: does a report follow?
            self._then_report = metadata.get("then") == "report"
            self.failed = FailureKind(metadata.get("kind") or FailureKind.bad_request)
        elif kind == "logs" and self.failed is None:  # after a refusal: only its short report's end
            print(frame.get("output", ""), file=sys.stderr)
        elif kind == "report":
            self.report.append(str(frame.get("output", "")))
        elif kind == "path":
            self.files = dict(frame.get("output") or {})

    _then_report = False

    def end(self) -> int:
        """Print the report (a task that could not run has none worth printing); the exit code."""
        if self.failed is not None:
            return EXIT_CODES[self.failed]
        print("".join(self.report), end="")
        return 0


async def _ask_here(args: argparse.Namespace) -> int:
    """The task in this process, as a server would run it (the same runtime, limits and job store,
    so the report is kept with the server's): no server needed."""
    from fedresearch.core.auth import Principal
    from fedresearch.core.metrics import Metrics
    from fedresearch.core.models import ResearchRequest
    from fedresearch.jobs.runs import start_job
    from fedresearch.jobs.runtime import Given, open_runtime
    from fedresearch.jobs.stopping import Stopping, stop_limits
    from fedresearch.jobs.store import follow
    from fedresearch.report.render import ExportFailed
    from fedresearch.retrievers import ADAPTERS
    from fedresearch.web.auth import validation_message

    settings = Settings()
    try:
        request = ResearchRequest.model_validate(_task_of(args))
    except ValidationError as error:
        print(f"fedresearch: {validation_message(error)}", file=sys.stderr)
        return EXIT_CODES[FailureKind.bad_request]
    given = Given(ADAPTERS, Metrics(), Stopping(*stop_limits(settings)))
    async with open_runtime(settings, given) as runtime:
        # the operator of this machine: any user's library, as `fedresearch ingest` may fill any
        run, live = await start_job(runtime, Principal(None, admin=True), request, "cli", detached=False)
        shown = _Follower()
        async for frame in follow(runtime.jobs, run.research_id):
            shown.take(json.loads(frame.text))
            if shown.done:
                break
        await asyncio.wait({live.task})
        code = shown.end()
        if code == 0 and args.output is not None:
            reports = runtime.reports()
            for kind in args.formats:
                try:
                    made = await reports.export(run.research_id, kind)
                except ExportFailed as failed:
                    print(f"Not saved: {kind}: {failed.reason}", file=sys.stderr)
                    continue
                if made is not None:
                    print(f"Saved {kind}: {_copy_out(made, args.output, args.question, kind)}", file=sys.stderr)
        return code


def _copy_out(made: Path, folder: Path, question: str, kind: str) -> Path:
    """A report's file copied to `folder`, named after its question."""
    import shutil

    from fedresearch.report.store import file_name

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / file_name(question, kind)
    shutil.copyfile(made, target)
    return target


async def _ask_over_ws(args: argparse.Namespace) -> int:
    import websockets

    base = args.server.rstrip("/").removesuffix("/ws")
    # the key travels in a header: a query string ends up in access logs
    auth = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    shown = _Follower()
    async with websockets.connect(base + "/ws", max_size=None, additional_headers=auth) as ws:
        await ws.send("start " + json.dumps(_task_of(args)))
        async for raw in ws:
            shown.take(json.loads(raw))
            if shown.done:
                break
    if not shown.done:
        print("the server closed the connection before the report was finished", file=sys.stderr)
        return UNREACHABLE
    code = shown.end()
    if code == 0 and shown.files is not None:
        await asyncio.to_thread(_fetch_files, args, base, auth, shown.files)
    return code


def _fetch_files(args: argparse.Namespace, base: str, auth: dict[str, str], files: dict[str, str]) -> None:
    """Where the server keeps the report's files; with --output, those asked for, fetched there."""
    import urllib.request

    from fedresearch.report.store import file_name

    http = base.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
    for kind, path in files.items():
        if args.output is None:  # the server keeps them, there
            print(f"Saved {kind}: {http}/{path}", file=sys.stderr)
            continue
        if kind not in args.formats:
            continue
        with urllib.request.urlopen(urllib.request.Request(f"{http}/{path}", headers=auth), timeout=60) as answer:
            args.output.mkdir(parents=True, exist_ok=True)
            target = args.output / file_name(args.question, kind)
            target.write_bytes(answer.read())
        print(f"Saved {kind}: {target}", file=sys.stderr)


def _ask(args: argparse.Namespace) -> int:
    if args.server is None:
        return asyncio.run(_ask_here(args))
    from websockets.exceptions import ConnectionClosedError, InvalidHandshake, InvalidStatus, InvalidURI

    try:
        return asyncio.run(_ask_over_ws(args))
    except OSError as error:
        print(f"cannot reach the server: {error}", file=sys.stderr)
    except InvalidURI as error:
        print(f"--server is not a WebSocket address ({error}): give ws://HOST:PORT", file=sys.stderr)
    except InvalidStatus as error:
        status = error.response.status_code
        why = {401: ": it needs an API key (--token)", 403: ": the key may not do this", 404: ": is it fedresearch?"}
        print(f"the server refused the WebSocket connection with HTTP {status}{why.get(status, '')}", file=sys.stderr)
    except InvalidHandshake as error:
        print(f"the server did not accept a WebSocket connection: {error}", file=sys.stderr)
    except ConnectionClosedError as error:
        print(f"the connection broke before the report was finished: {error}", file=sys.stderr)
    return UNREACHABLE


def _formats(text: str) -> list[str]:
    """`--format`: a comma list of the formats reports are saved in."""
    from fedresearch.report.exports import EXPORT_FORMATS

    asked = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [kind for kind in asked if kind not in EXPORT_FORMATS]
    if unknown or not asked:
        raise argparse.ArgumentTypeError(f"{', '.join(unknown) or text!r}: formats are {', '.join(EXPORT_FORMATS)}")
    return asked


_EXITS = (
    "exit status: 0 the report is written; 1 the server could not be reached; 2 the request was refused as "
    "sent; 3 too many tasks for this key; 4 the server is stopping; 5 the task ran out of time; 6 an internal error"
)


def _add_ask(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ask = commands.add_parser(
        "ask",
        help="run one research task, here or on a running server, and print its report",
        epilog=_EXITS,
    )
    ask.add_argument("question")
    ask.add_argument("--retrievers", help="comma list or aliases, e.g. library,tavily,google")
    ask.add_argument("--user")
    ask.add_argument("--type", help="internal_api_type: biblio, highlight or File")
    forms = offered_forms()
    described = "; ".join(f"{form.name}: {form.description}" for form in forms)
    ask.add_argument("--report-type", default=forms[0].name, choices=[form.name for form in forms], help=f"{described}")
    ask.add_argument("--report-source", choices=("web", "local", "hybrid"))
    ask.add_argument("--language", help="the report's language (default: the question's), e.g. english, chinese")
    ask.add_argument("--tone", help="the report's tone, e.g. objective, formal")
    ask.add_argument(
        "--output", type=Path, metavar="DIR", help="save the report's files in DIR, named after the question"
    )
    ask.add_argument(
        "--format",
        dest="formats",
        type=_formats,
        default=["md"],
        metavar="FORMATS",
        help="with --output: which files, a comma list of md, html, pdf, docx, json, bib, ris (default: md)",
    )
    ask.add_argument("--server", help="ws://HOST:PORT of a running server (default: run the task in this process)")
    ask.add_argument("--token", help="API key, when the server requires one")
    ask.set_defaults(run=_ask)


def _add_library(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    library = commands.add_parser("library", help="list or delete a user's documents, or check the index")
    actions = library.add_subparsers(dest="action", required=True)
    actions.add_parser("check", help="check the full-text index against SQLite; rebuild what is missing")
    listing = actions.add_parser("list")
    listing.add_argument("--user", required=True)
    delete = actions.add_parser("delete")
    delete.add_argument("--user", required=True)
    delete.add_argument("ids", nargs="+", type=int)
    migrate = actions.add_parser(
        "migrate", help="copy the embedded library (every user, passages and vectors) into PostgreSQL"
    )
    migrate.add_argument(
        "--to",
        metavar="postgresql://…",
        help="the PostgreSQL library to fill (default: FEDRESEARCH_LIBRARY_URL, which keeps its password out of ps)",
    )
    library.set_defaults(run=_library)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="fedresearch", description="Federated research over your library and the web.")
    commands = root.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--workers",
        type=_worker_count,
        help="processes sharing the port: a number, or auto (the cores this process may use)",
    )
    serve.add_argument(
        "--balance",
        choices=("reuseport", "shared"),
        default="reuseport",
        help="with several workers: a listening socket each (SO_REUSEPORT), or one shared socket",
    )
    serve.add_argument("--as-worker", type=int, help=argparse.SUPPRESS)  # the supervisor's pid
    serve.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # written to once listening
    serve.set_defaults(run=_serve)
    ingest = commands.add_parser("ingest", help="add files or folders to a user's library")
    ingest.add_argument("--user", required=True)
    ingest.add_argument(
        "--type",
        default="highlight",
        choices=("biblio", "highlight", "file"),
        help="type for notes and text files (records are always biblio)",
    )
    ingest.add_argument("paths", nargs="+")
    ingest.set_defaults(run=_ingest)
    mcp = commands.add_parser("mcp", help="serve the MCP tools (search, research, ...) over stdio")
    mcp.set_defaults(run=_mcp)
    _add_ask(commands)
    _add_library(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    from fedresearch.library.store import LibraryDatabaseError, LibraryUnavailable

    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (LibraryDatabaseError, LibraryUnavailable) as error:  # for the operator to fix: no traceback
        print(f"fedresearch: {error}", file=sys.stderr)
        return 1
    except ValidationError as error:
        if error.title not in settings_classes():
            raise
        print(f"fedresearch: {settings_problems(error)}", file=sys.stderr)
        return 2


def settings_classes() -> set[str]:
    """The names of the classes that hold operator settings: the server's, and each upstream's (read
    when the registry is built, as a server process starts)."""
    from fedresearch.retrievers import ADAPTERS  # only once something failed: a supervisor imports no adapter

    return {Settings.__name__, *(upstream.about.settings.__name__ for upstream in ADAPTERS)}


def settings_problems(error: ValidationError) -> str:
    """What is wrong with the settings, by name, without the values given: a URL may hold a password."""
    problems = []
    for problem in error.errors(include_input=False, include_url=False):
        name = ".".join(str(part) for part in problem["loc"])
        problems.append(f"{name}: {problem['msg'].removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(problems)


if __name__ == "__main__":
    sys.exit(main())
