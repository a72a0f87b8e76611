"""The ``duplex`` command: ``serve``, ``talk``, ``plugins``, ``bench``.

``duplex serve``    load a plugin and serve it on ``/v1/realtime`` (see ``duplex.server.serve``);
                    with ``--gpus N`` (N > 1), one engine replica per GPU on Ray Serve
                    (``duplex.cluster``; README, "Scaling out");
``duplex talk``     a conversation with a server: a WAV file, a video clip or the live microphone
                    (and camera) in, the transcripts printed, the reply saved or played as it
                    arrives (see ``clients.talk``);
``duplex plugins``  the installed plugins as a table (``--json``: one object each), read without
                    importing them; ``duplex plugins NAME``: one plugin and its options with
                    their defaults;
``duplex tiny-checkpoint NAME DIR``
                    write a tiny random-weight checkpoint of plugin NAME (the public layout, tiny
                    shapes) to DIR, to serve it on a CPU with nothing downloaded;
``duplex bench``    ``load``, ``latency`` and ``omniinteract`` benchmarks against a server (see
                    ``bench.cli``).

Importing this module loads nothing of ``bench`` (the dependency rule: ``duplex`` never imports
``bench``); ``build_parser`` imports ``bench.cli`` (standard library only) to add its subcommands,
and its handlers import the rest of ``bench`` when they run.

Every option's help ends with its default. The subcommands that connect to a server (``talk``,
``bench``) take the API key from ``--api-key`` or else from the environment variable
``DUPLEX_API_KEY``.

Exit status: 0 on success, 2 for a usage or configuration error, 1 for a failure at run time.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from duplex import version
from duplex.engine.config import EngineConfig
from duplex.server.config import ServerConfig

__all__ = ["API_KEY_ENV", "HelpFormatter", "build_parser", "main"]

#: The environment variable the subcommands that connect read the API key from.
API_KEY_ENV = "DUPLEX_API_KEY"
LOG_LEVELS = ("debug", "info", "warning", "error")


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with ``(default: X)``, unless the help already names its default
    or the option has none (a flag, or a value that only overrides the configuration file, whose
    default the help then states itself)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings:
            return text
        if action.default is None or action.default is False or action.default in (argparse.SUPPRESS, []):
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex", description="Real-time full-duplex model serving.", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"duplex {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_talk(sub)
    plugins = sub.add_parser(
        "plugins",
        help="the installed plugins (with NAME: one plugin and its options)",
        description="The installed plugins, or with NAME one plugin and its options with their defaults "
        "(set them with duplex serve --plugin-option KEY=VALUE).",
        formatter_class=HelpFormatter,
    )
    plugins.add_argument("name", nargs="?", metavar="NAME", help="a plugin to describe")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    tiny = sub.add_parser(
        "tiny-checkpoint",
        help="write a tiny random-weight checkpoint of a model plugin, to serve on a CPU",
        formatter_class=HelpFormatter,
    )
    tiny.add_argument("plugin", help="plugin name")
    tiny.add_argument("directory", help="directory to write (created if missing)")
    tiny.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    _add_bench(sub)
    return parser


def _add_serve(sub: argparse._SubParsersAction) -> None:
    server, engine = ServerConfig(), EngineConfig()
    serve = sub.add_parser(
        "serve",
        help="serve a plugin over the OpenAI Realtime WebSocket API",
        description="Serve a model on /v1/realtime (and the HTTP routes of batch models). Options given "
        "here override the configuration file (--config); the defaults shown are the file's.",
        formatter_class=HelpFormatter,
    )
    model = serve.add_argument_group("model")
    model.add_argument(
        "--plugin", help="plugin name, see 'duplex plugins' (default: 'default' when it loads, else 'echo')"
    )
    model.add_argument(
        "--model-path", metavar="DIR", help="directory with the model's weights (default: none)"
    )
    model.add_argument(
        "--model-name",
        help="model name clients ask for and see; the plugin's public names (its vendor's repository "
        "ids: 'duplex plugins NAME') ask for it too (default: the plugin name)",
    )
    model.add_argument(
        "--plugin-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="plugin option (repeatable; 'duplex plugins NAME' lists them); overrides plugin_options of "
        "the config file (default: none)",
    )
    network = serve.add_argument_group("network and access")
    network.add_argument("--host", help=f"address to bind (default: {server.host})")
    network.add_argument("--port", type=int, help=f"port to bind (default: {server.port})")
    network.add_argument(
        "--api-key",
        action="append",
        dest="api_keys",
        metavar="KEY",
        help="accepted API key (repeatable; default: none, every client is accepted)",
    )
    sessions = serve.add_argument_group("sessions")
    sessions.add_argument(
        "--max-sessions",
        type=int,
        metavar="N",
        help=f"concurrent sessions before resource_exhausted (default: {engine.max_sessions}; the "
        "plugin's own limit caps it)",
    )
    sessions.add_argument(
        "--max-queue-length",
        type=int,
        metavar="N",
        help=f"opens that may wait for a slot past --max-sessions (default: {engine.max_queue_length}; "
        "0: refuse at once)",
    )
    sessions.add_argument(
        "--max-queue-wait-s",
        type=float,
        metavar="S",
        help=f"seconds an open may wait for a slot (default: {engine.max_queue_wait_s:g})",
    )
    worker = serve.add_argument_group("worker process")
    worker.add_argument(
        "--worker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the plugin in a supervised worker process (restarted if it dies; the server lives on); "
        "default: the plugin's choice (a model on a CUDA device runs in one)",
    )
    worker.add_argument(
        "--worker-python",
        metavar="PATH",
        help="run the worker with this interpreter (another virtual environment's; implies --worker; "
        "default: this one)",
    )
    scale = serve.add_argument_group("scale-out")
    scale.add_argument(
        "--gpus",
        type=int,
        help="engine replicas, one per GPU, behind Ray Serve on this host (needs duplex-runtime[cluster]; "
        "default: the config file's cluster.gpus, else 1: this one process, without Ray)",
    )
    general = serve.add_argument_group("configuration and logging")
    general.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with server, engine and plugin settings (README, Configuration; default: none)",
    )
    general.add_argument(
        "--log-level", default="info", choices=LOG_LEVELS, help="the server's log messages from this level on"
    )


def _add_talk(sub: argparse._SubParsersAction) -> None:
    talk = sub.add_parser(
        "talk",
        help="talk to a server: a WAV file, a video clip or the live microphone (and camera) in, the reply "
        "printed and played",
        description="A conversation with a server. Prints what was heard and said, and for each reply "
        "the time from the end of your speech to its first audio.",
        formatter_class=HelpFormatter,
    )
    talk.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime", help="server WebSocket URL")
    src = talk.add_mutually_exclusive_group()
    src.add_argument("--wav", help="WAV file to send (any rate; mono or the first channel; default: none)")
    src.add_argument(
        "--mic", action="store_true", help="stream the microphone live until Ctrl-C (needs 'sounddevice')"
    )
    src.add_argument(
        "--video",
        metavar="FILE",
        help="stream a recorded clip in real time: its sound, and one picture a second to a model that "
        "takes video (needs 'av'; default: none)",
    )
    talk.add_argument(
        "--camera",
        nargs="?",
        const="",
        metavar="DEVICE",
        help="with --mic or --wav: send one camera picture a second to a model that takes video "
        "(default device: /dev/video0 on Linux; needs 'av')",
    )
    talk.add_argument(
        "--camera-format",
        metavar="FORMAT",
        help="the camera's FFmpeg input format (default: v4l2 on Linux, avfoundation on macOS, dshow on "
        "Windows; lavfi for a synthetic picture)",
    )
    talk.add_argument(
        "--seconds", type=float, help="with --mic: stop after this many seconds (default: at Ctrl-C)"
    )
    talk.add_argument("--model", help="model name to ask for (default: the server's first model)")
    talk.add_argument(
        "--api-key", help=f"API key (Authorization: Bearer; default: ${API_KEY_ENV} when it is set)"
    )
    talk.add_argument("--out", help="save the reply audio to this WAV file (default: not saved)")
    talk.add_argument(
        "--play",
        action="store_true",
        help="play the reply as it arrives, acknowledge what was played, stop it when you speak "
        "(needs 'sounddevice')",
    )
    talk.add_argument(
        "--input-device", help="microphone: a sounddevice index or name (default: the system's)"
    )
    talk.add_argument("--output-device", help="speaker: a sounddevice index or name (default: the system's)")
    talk.add_argument(
        "--device-rate", type=int, help="open the sound devices at this rate (default: the devices' own)"
    )
    talk.add_argument(
        "--no-aec",
        action="store_true",
        help="with --mic --play: no echo cancellation (with headphones; by default the speaker's "
        "sound is taken out of the microphone)",
    )
    talk.add_argument(
        "--jitter-ms", type=int, default=60, help="with --play: audio buffered before playback (re)starts"
    )
    talk.add_argument("--chunk-ms", type=int, default=0, help="append size (default: the model's frame)")
    talk.add_argument(
        "--fast", action="store_true", help="send the file as fast as possible, not in real time"
    )
    talk.add_argument("--tail-ms", type=int, default=1500, help="silence sent after the input")
    talk.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply to end")
    talk.add_argument(
        "--events-out", help="write every server event to this file, one JSON line each (default: none)"
    )
    talk.add_argument("--quiet", action="store_true", help="no progress line")


def _add_bench(sub: argparse._SubParsersAction) -> None:
    try:
        from bench.cli import add_bench_subcommands
    except ImportError as exc:  # an install without the benchmarks: say so when asked for them
        missing = sub.add_parser("bench", help="benchmarks (not installed)")
        missing.set_defaults(bench_missing=str(exc))
        return
    add_bench_subcommands(sub)


def _cmd_serve(args: argparse.Namespace) -> int:
    import msgspec

    from duplex.plugins.base import PluginError
    from duplex.server.config import ConfigError, load_serve_config
    from duplex.server.serve import serve

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = load_serve_config(args.config)
        server = cfg.server
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        if args.api_keys:
            overrides["api_keys"] = tuple(args.api_keys)
        if overrides:
            server = msgspec.structs.replace(server, **overrides)
        options = dict(cfg.plugin_options)
        for item in args.plugin_option:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--plugin-option expects KEY=VALUE, got {item!r}")
            options[key] = value
        engine = dict(cfg.engine)
        for key in ("max_sessions", "max_queue_length", "max_queue_wait_s"):
            if getattr(args, key) is not None:
                engine[key] = getattr(args, key)
        cfg = msgspec.structs.replace(
            cfg,
            plugin=args.plugin or cfg.plugin,
            model_path=args.model_path or cfg.model_path,
            model_name=args.model_name or cfg.model_name,
            plugin_options=options,
            worker=args.worker if args.worker is not None else cfg.worker,
            worker_python=args.worker_python or cfg.worker_python,
            server=server,
            engine=engine,
        )
        cluster = _cluster(cfg, args.gpus)
        if cluster is not None:
            return _serve_cluster(cfg, cluster, args.log_level)
        serve(cfg, log_level=args.log_level)
    except (ConfigError, PluginError) as exc:
        print(f"duplex serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _cluster(cfg: Any, gpus: int | None) -> Any:
    """The ``ClusterConfig`` when more than one engine replica is asked for (``--gpus`` or the
    file's ``cluster.gpus``), else ``None``: one process, and Ray is never imported."""
    import msgspec

    from duplex.cluster.config import ClusterConfig
    from duplex.server.config import ConfigError

    fields = dict(cfg.cluster)
    if gpus is not None:
        fields["gpus"] = gpus
    try:
        cluster = msgspec.convert(fields, ClusterConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"cluster: {exc}") from exc
    return cluster if cluster.gpus > 1 else None


def _serve_cluster(cfg: Any, cluster: Any, log_level: str) -> int:
    try:
        from duplex.cluster.local import serve_cluster
    except ImportError as exc:
        extra = "pip install 'duplex-runtime[cluster]'"
        print(f"duplex serve: --gpus {cluster.gpus} needs Ray Serve: {extra} ({exc})", file=sys.stderr)
        return 2
    serve_cluster(cfg, cluster, log_level=log_level)
    return 0


def _cmd_plugins(args: argparse.Namespace) -> int:
    from duplex.plugins.base import PluginError
    from duplex.plugins.listing import describe_plugin, plugins_table

    try:
        print(
            describe_plugin(args.name, as_json=args.json) if args.name else plugins_table(as_json=args.json)
        )
    except PluginError as exc:
        print(f"duplex plugins: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_tiny_checkpoint(args: argparse.Namespace) -> int:
    from duplex.plugins import registry
    from duplex.plugins.base import PluginError

    try:
        registry.load_class(args.plugin).write_tiny_checkpoint(args.directory, seed=args.seed)
    except PluginError as exc:
        print(f"duplex tiny-checkpoint: {exc}", file=sys.stderr)
        return 2
    print(args.directory)
    return 0


def _cmd_talk(args: argparse.Namespace) -> int:
    from clients.talk import TalkError, talk

    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    try:
        return talk(args)
    except TalkError as exc:
        print(f"duplex talk: {exc}", file=sys.stderr)
        return exc.status


def _cmd_bench(args: argparse.Namespace) -> int:
    missing = getattr(args, "bench_missing", None)
    if missing is not None:
        print(f"duplex bench: the benchmarks are not installed ({missing})", file=sys.stderr)
        return 2
    from bench.cli import run_bench

    return run_bench(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``duplex`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    handlers = {
        "serve": _cmd_serve,
        "talk": _cmd_talk,
        "plugins": _cmd_plugins,
        "tiny-checkpoint": _cmd_tiny_checkpoint,
        "bench": _cmd_bench,
    }
    handler = handlers[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
