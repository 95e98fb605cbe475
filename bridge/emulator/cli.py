"""``k8s-bridge emulator`` (and ``python -m bridge.emulator``): serve the emulator until stopped."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from bridge.aiotasks import cancel_and_wait
from bridge.errors import BridgeError, ConfigError, listen_error
from bridge.ground.argtypes import OneLineParser, positive_float


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    p.add_argument("--kubeconfig", metavar="PATH", help="write a kubeconfig for the emulator here")
    p.add_argument(
        "--bookmark-interval", type=float, default=60.0, help="seconds between watch bookmarks"
    )
    p.add_argument(
        "--history-limit",
        type=int,
        default=50_000,
        help="keep at most N events; watching from an older RV gets 410 (default 50000)",
    )
    p.add_argument(
        "--no-watch-list",
        action="store_true",
        help="ignore sendInitialEvents, like a server without streaming lists",
    )
    p.add_argument(
        "--no-sharded-list-watch",
        action="store_true",
        help="ignore shardSelector, like a server with the ShardedListAndWatch gate off",
    )
    p.add_argument(
        "--expired-mode",
        choices=["event", "http"],
        default="event",
        help="how a too-old watch RV is refused: ERROR event (default) or HTTP 410",
    )
    p.add_argument("--churn", action="store_true", help="run the realistic change generator")
    p.add_argument(
        "--churn-rate", type=positive_float, default=5.0, help="changes per second with --churn"
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for --churn")


async def serve(args: argparse.Namespace) -> None:
    # Here, not at the top: `k8s-bridge run` imports this module for configure_parser,
    # and the server would bring aiohttp.web into every bridge.
    from bridge.emulator.churn import ChurnGenerator
    from bridge.emulator.server import Emulator

    emu = Emulator(
        host=args.host,
        port=args.port,
        bookmark_interval=args.bookmark_interval,
        history_limit=args.history_limit,
        watch_list=not args.no_watch_list,
        expired_mode=args.expired_mode,
        sharded_list_watch=not args.no_sharded_list_watch,
    )
    emu.register_resource(
        group="example.com", version="v1", kind="Widget", plural="widgets", short_names=["wd"]
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    churn_task: asyncio.Task[None] | None = None
    try:
        await emu.start()
    except OSError as exc:
        await emu.stop()
        raise listen_error("--host", "--port", args.host, args.port, exc) from exc
    try:
        if args.kubeconfig:
            try:
                emu.write_kubeconfig(args.kubeconfig)
            except OSError as exc:
                raise ConfigError(
                    f"config error: --kubeconfig: cannot write {args.kubeconfig}: "
                    f"{exc.strerror or exc}"
                ) from exc
        if args.churn:
            churn_task = asyncio.create_task(
                ChurnGenerator(emu, rate=args.churn_rate, seed=args.seed).run(), name="churn"
            )
        # One parseable line: whoever started us waits for it to know we serve.
        print(f"emulator serving {emu.url}", flush=True)
        await stop.wait()
    finally:
        if churn_task is not None:
            await cancel_and_wait([churn_task])
        await emu.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m bridge.emulator", description=__doc__)
    configure_parser(parser)
    try:
        return run(parser.parse_args(argv))
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except BridgeError as e:
        print(f"{parser.prog}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
