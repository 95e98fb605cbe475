"""The ``k8s-bridge`` command line: run | demo | check | replay | snapshot | tail | mirror |
emulator | config."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import io
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from bridge import __version__
from bridge.cli.stdio import EXIT_BROKEN_PIPE, discard_stdout
from bridge.errors import BridgeError, ConfigError

if TYPE_CHECKING:
    from bridge.service.settings import Settings

from bridge.ground.argtypes import (
    OneLineParser,
    non_negative_float,
    non_negative_int,
    positive_float,
)

EXIT_CONFIG = 2
EXIT_FAILURE = 1


def _add_config_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="bridge YAML file")
    p.add_argument("--kubeconfig", help="overrides cluster.kubeconfig")
    p.add_argument("--context", help="overrides cluster.context")
    p.add_argument("--sink", choices=["nats", "kafka", "stdout"], help="overrides sink.kind")
    p.add_argument(
        "--log-format", choices=["auto", "json", "console"], help="overrides logging.format"
    )
    p.add_argument("--log-level", help="overrides logging.level")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="k8s-bridge",
        description="Publish every real change of Kubernetes objects to Kafka or NATS JetStream.",
    )
    parser.add_argument("--version", action="version", version=f"k8s-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the bridge until SIGTERM/SIGINT")
    _add_config_args(run)

    check = sub.add_parser("check", help="check config, API access, resources and the bus")
    _add_config_args(check)

    replay = sub.add_parser("replay", help="re-publish the changes after a resourceVersion")
    _add_config_args(replay)
    replay.add_argument("--resource", required=True, help="kind (or apiVersion/kind) to replay")
    replay.add_argument("--from-resource-version", required=True, dest="from_rv")
    replay.add_argument("--namespace", help="when the resource is configured per namespace")

    snapshot = sub.add_parser(
        "snapshot", help="ask the running bridge to re-announce every object of a resource"
    )
    _add_config_args(snapshot)
    snapshot.add_argument("--resource", required=True, help="kind (or apiVersion/kind)")
    snapshot.add_argument(
        "--url", help="the bridge's server (default: http://server.host:server.port)"
    )
    snapshot.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds to wait for the counts"
    )
    snapshot.add_argument(
        "--token",
        help="bearer token to send (default: server.controlToken, or with controlAuth"
        " kubernetes the token of the config's cluster credentials)",
    )

    tail = sub.add_parser("tail", help="print events from the bus")
    _add_config_args(tail)
    tail.add_argument("--resource", help="only this kind (or apiVersion/kind)")
    tail.add_argument(
        "--count", type=non_negative_int, default=0, help="stop after N events (0 = follow)"
    )
    tail.add_argument("--from-start", action="store_true", help="start at the first event kept")
    tail.add_argument(
        "--group",
        help="read as this consumer group (Kafka) / durable (JetStream): resume where it left",
    )
    tail.add_argument(
        "--positions", help="with --group: keep the group's positions in this SQLite file"
    )
    tail.add_argument(
        "--timeout", type=non_negative_float, default=0, help="stop after N idle seconds"
    )

    mirror = sub.add_parser("mirror", help="keep a PostgreSQL database equal to the bus's objects")
    mirror.add_argument("--config", "-c", required=True, help="mirror YAML file (docs/mirror.md)")
    mirror.add_argument(
        "--log-format", choices=["auto", "json", "console"], help="overrides logging.format"
    )
    mirror.add_argument("--log-level", help="overrides logging.level")

    demo = sub.add_parser("demo", help="the bridge against an embedded API emulator, no setup")
    demo.add_argument("--sink", choices=["stdout", "nats", "kafka"], default="stdout")
    demo.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    demo.add_argument("--kafka-bootstrap", default="127.0.0.1:9092")
    demo.add_argument("--duration", type=float, default=0, help="stop after N seconds (0 = Ctrl-C)")
    demo.add_argument(
        "--rate", type=positive_float, default=5.0, help="churn operations per second (> 0)"
    )
    demo.add_argument("--json", action="store_true", help="print whole CloudEvents, not summaries")

    emulator = sub.add_parser("emulator", help="serve the Kubernetes API emulator")
    from bridge.emulator.cli import configure_parser

    configure_parser(emulator)

    config = sub.add_parser("config", help="configuration helpers")
    config_sub = config.add_subparsers(dest="config_command", metavar="WHAT")
    config_sub.add_parser("schema", help="print the JSON Schema of the config file")
    validate = config_sub.add_parser("validate", help="validate a config file")
    validate.add_argument("--config", "-c", required=True)
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "cluster.kubeconfig": getattr(args, "kubeconfig", None),
        "cluster.context": getattr(args, "context", None),
        "sink.kind": getattr(args, "sink", None),
        "logging.format": getattr(args, "log_format", None),
        "logging.level": getattr(args, "log_level", None),
    }
    return {k: v for k, v in pairs.items() if v is not None}


def run_until_signal(main: Callable[[asyncio.Event], Coroutine[Any, Any, int]]) -> int:
    """Run ``main(stop)``; SIGINT/SIGTERM set ``stop`` so it can flush and exit 0."""

    async def runner() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    return asyncio.run(runner())


def _cmd_run(args: argparse.Namespace) -> int:
    from bridge.logging import configure_logging
    from bridge.service import tuning
    from bridge.service.app import BridgeApp
    from bridge.service.settings import load_settings

    settings = load_settings(args.config, _overrides(args))
    configure_logging(settings.logging.format, settings.logging.level)
    warn_deprecated(settings)

    # Process-wide, so made here and nowhere else: an app built elsewhere (tests,
    # benchmarks) runs on the interpreter's defaults.
    tuned = tuning.apply(tuning.Tuning.for_run(settings.informer))
    after_sync = tuned.after_first_sync if tuned.trim_after_sync else None

    async def main(stop: asyncio.Event) -> int:
        await BridgeApp(settings, after_first_sync=after_sync).run(stop)
        return 0

    return run_until_signal(main)


def warn_deprecated(settings: Settings) -> None:
    """One warning line per deprecated key the configuration still uses."""
    from bridge.logging import get_logger

    for line in settings.checkpoint.deprecations():
        get_logger("bridge.config").warning(line)


def _cmd_config(args: argparse.Namespace) -> int:
    from bridge.service.settings import load_settings, settings_json_schema

    if args.config_command == "schema":
        sys.stdout.write(orjson.dumps(settings_json_schema(), option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
        return 0
    if args.config_command == "validate":
        settings = load_settings(args.config)
        for line in settings.checkpoint.deprecations():
            print(f"{args.config}: warning: {line}", file=sys.stderr)
        print(f"{args.config}: ok")
        return 0
    print("usage: k8s-bridge config {schema,validate}", file=sys.stderr)
    return EXIT_CONFIG


def _cmd_check(args: argparse.Namespace) -> int:
    from bridge.cli.check import run_checks
    from bridge.service.settings import load_settings

    settings = load_settings(args.config, _overrides(args))
    return asyncio.run(run_checks(settings, sys.stdout))


def _cmd_replay(args: argparse.Namespace) -> int:
    from bridge.cli.replay import replay
    from bridge.logging import configure_logging
    from bridge.service.settings import load_settings

    settings = load_settings(args.config, _overrides(args))
    configure_logging(settings.logging.format, settings.logging.level)

    async def main(stop: asyncio.Event) -> int:
        return await replay(settings, args.resource, args.from_rv, args.namespace, stop, sys.stderr)

    return run_until_signal(main)


def _cmd_snapshot(args: argparse.Namespace) -> int:
    from bridge.cli.snapshot import request_snapshot, summary
    from bridge.service.settings import load_settings

    settings = load_settings(args.config, _overrides(args))
    body = asyncio.run(
        request_snapshot(
            settings, args.resource, url=args.url, timeout=args.timeout, token=args.token
        )
    )
    print(summary(body))
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    from bridge.cli.tail import tail
    from bridge.logging import configure_logging
    from bridge.service.settings import load_settings

    settings = load_settings(args.config, _overrides(args))
    # Logs go to stderr: stdout carries only the events.
    configure_logging(settings.logging.format, settings.logging.level)

    async def main(stop: asyncio.Event) -> int:
        return await tail(
            settings,
            resource=args.resource,
            count=args.count,
            from_start=args.from_start,
            idle_timeout=args.timeout or None,
            stop=stop,
            out=sys.stdout,
            group=args.group,
            positions=args.positions,
        )

    return run_until_signal(main)


def _cmd_mirror(args: argparse.Namespace) -> int:
    from bridge.cli.mirror import run_mirror
    from bridge.logging import configure_logging
    from bridge.mirror.settings import load_mirror_settings

    settings = load_mirror_settings(args.config, _overrides(args))
    configure_logging(settings.logging.format, settings.logging.level)
    return run_until_signal(lambda stop: run_mirror(settings, stop))


def _cmd_demo(args: argparse.Namespace) -> int:
    from bridge.cli.demo import run_demo

    return run_until_signal(lambda stop: run_demo(args, stop, sys.stdout))


def _cmd_emulator(args: argparse.Namespace) -> int:
    from bridge.emulator.cli import run

    return run(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "check": _cmd_check,
    "replay": _cmd_replay,
    "snapshot": _cmd_snapshot,
    "tail": _cmd_tail,
    "mirror": _cmd_mirror,
    "demo": _cmd_demo,
    "emulator": _cmd_emulator,
    "config": _cmd_config,
}


def main(argv: list[str] | None = None) -> int:
    # A crash in native code (an extension, the interpreter) then leaves the Python
    # stack of every thread on stderr instead of a bare "exit -11".
    # (Not when stderr is no file, as when a caller captured it.)
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.enable()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_CONFIG
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_CONFIG
    except BridgeError as e:
        print(f"k8s-bridge {args.command}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 0
