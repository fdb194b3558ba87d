"""`triton-gateway` command line: parse arguments, run. Nothing else."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from gateway.errors import ConfigurationError, GatewayError
from gateway.names import ACTIVATIONS, DEFAULT_ACTIVATION, TASKS, TEXT_TASK
from gateway.settings import Settings

# The --normalize presets (gateway.modelrepo.imageentry.PRESETS; not imported here to keep the
# command's start light).
PRESET_NAMES = ("efficientnet-lite", "imagenet", "inception")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated numbers") from None


def _size(text: str) -> tuple[int, int]:
    height, _, width = text.lower().partition("x")
    try:
        size = (int(height), int(width or height))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not HEIGHTxWIDTH (e.g. 224x224)") from None
    if min(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: sides must be positive")
    return size


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-gateway", description="A validating front door for Triton.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="run the gateway against an existing Triton (GATEWAY_TRITON__URL)"
    )
    serve.add_argument("--host", help="listen address (default GATEWAY_HOST or 0.0.0.0)")
    serve.add_argument("--port", type=int, help="listen port (default GATEWAY_PORT or 8080)")

    commands.add_parser(
        "hash-key",
        help="read an API key on stdin, print its SHA-256 for the keys file (GATEWAY_AUTH__KEYS_FILE)",
    )

    new_key = commands.add_parser(
        "new-key",
        help="make a random API key for client ID: append '<id> <sha256>' to a keys file (created "
        "with mode 600) and print the key, once, on stdout",
    )
    new_key.add_argument("id", help="the client's id (letters, digits, '_.-'; metrics and logs name it)")
    new_key.add_argument("--keys-file", type=Path, required=True, help="the keys file to append to")
    new_key.add_argument("--rate", type=float, help="requests per second allowed to this key")

    bench = commands.add_parser(
        "bench",
        help="the gateway side by side with Triton direct (needs a checkout: its trivial model "
        "repository, wrk); what `make bench` runs",
    )
    bench.add_argument("options", nargs="*", help="passed on to the benchmark (`bench --help`)")

    add = commands.add_parser(
        "add-model",
        help="write a classifier into a model repository (then load it through /admin: the catalog serves it)",
        description="Write a classifier into a Triton model repository, checked before anything is "
        "written: an image classifier from your ONNX file and its labels, a fine-tuned text "
        "classifier from your ONNX file, its tokenizer.json and its labels (each with the GPU "
        "config, its TensorRT profile and the CPU twin), or a zero-shot text classifier of your "
        "own labels on the shipped sentence encoder (--labels without --onnx). "
        "Then POST /admin/models/NAME/load.",
    )
    add.add_argument(
        "name", help="the model's name (its ensemble; its own steps are named NAME_<step> beside it)"
    )
    add.add_argument(
        "--task",
        required=True,
        choices=list(TASKS),
        help="what it classifies",
    )
    labels = add.add_mutually_exclusive_group(required=True)
    labels.add_argument(
        "--labels",
        type=Path,
        help="with --onnx: one class name a line, line n = class n - 1; zero-shot texts (no --onnx): "
        "`label` or `label: prompt` a line",
    )
    labels.add_argument(
        "--labels-from",
        type=Path,
        help="with --onnx: a Hugging Face config.json whose id2label names the classes",
    )
    add.add_argument("--repository", type=Path, default=Path("model_repository"))
    add.add_argument(
        "--reference",
        type=Path,
        help='a validation set\'s predictions (JSON lines: {"label": ..., "score": ...} or '
        "/classify answers): the model's drift reference until one is captured from live traffic",
    )
    add.add_argument("--replace", action="store_true", help="overwrite a model of that name")
    network = add.add_argument_group("your own network (--onnx; images and fine-tuned texts)")
    network.add_argument(
        "--onnx",
        type=Path,
        help="the network: images: one image input; texts: input_ids, attention_mask (and "
        "token_type_ids); one output of batch x classes",
    )
    network.add_argument(
        "--activation",
        choices=list(ACTIVATIONS),
        default=DEFAULT_ACTIVATION,
        help="how its outputs become scores: softmax (logits, one label per input; default), "
        "sigmoid (multi-label: each label on its own), none (it already outputs probabilities)",
    )
    network.add_argument("--output", dest="output_name", help="the output tensor, when the file has several")
    network.add_argument(
        "--max-batch",
        type=int,
        help="batch cap (default 32 images, 64 texts; 1 when the ONNX batch axis is fixed at 1)",
    )
    network.add_argument("--max-top-k", type=int, help="the largest top_k it answers (default 20)")
    text = add.add_argument_group("fine-tuned text classifiers (--task text-classification --onnx)")
    text.add_argument("--tokenizer", type=Path, help="the model's Hugging Face tokenizer.json")
    text.add_argument(
        "--max-length",
        type=int,
        help="truncate texts to this many tokens (default: what the position embeddings allow, else 512)",
    )
    image = add.add_argument_group("image classifiers (--task image-classification)")
    image.add_argument(
        "--normalize",
        choices=sorted(PRESET_NAMES),
        help="the pixel convention it was trained with: imagenet (torchvision's mean/std), "
        "inception ((x - 127.5) / 127.5), efficientnet-lite ((x - 127) / 128)",
    )
    image.add_argument(
        "--mean", type=_floats, help="or: three values, 0..255 scale, in the network's channel order"
    )
    image.add_argument("--std", type=_floats, help="with --mean: three values, 0..255 scale")
    image.add_argument("--channel-order", choices=["RGB", "BGR"], default="RGB", help="default RGB")
    image.add_argument(
        "--input-size", type=_size, help="HEIGHTxWIDTH, when the ONNX input's spatial size is dynamic"
    )
    image.add_argument(
        "--resize-short-side", type=int, help="resize before the centre crop (default: input side + 32)"
    )
    image.add_argument(
        "--input", dest="input_name", help="the input tensor (default: the ONNX file's only one)"
    )
    remove = commands.add_parser(
        "remove-model", help="remove a classifier written by add-model (unload it first)"
    )
    remove.add_argument("name")
    remove.add_argument("--repository", type=Path, default=Path("model_repository"))

    predictions = commands.add_parser(
        "predictions", help="the prediction log: `predictions export` reads a Redis sink back as JSON lines"
    )
    export = predictions.add_subparsers(dest="action", required=True).add_parser(
        "export",
        help="every record of the Redis streams, oldest first per model, one JSON document a line",
        description="Read the prediction log's Redis Streams (GATEWAY_PREDICTION_LOG__URL=redis://...) "
        "back as JSON lines on standard output; a summary per model (and the id to resume from) "
        "goes to standard error.",
    )
    export.add_argument(
        "--url",
        help="the Redis URL (default: GATEWAY_PREDICTION_LOG__URL); a password in it is better given "
        "through that variable than on a command line",
    )
    export.add_argument("--model", action="append", default=[], help="only this model (repeatable)")
    export.add_argument("--since", default="-", help="only records after this stream id")
    export.add_argument(
        "--prefix", help="the streams' prefix (default: GATEWAY_PREDICTION_LOG__STREAM_PREFIX)"
    )

    local = commands.add_parser("local", help="start a local CPU tritonserver and the gateway together")
    local.add_argument("--host", default="127.0.0.1", help="gateway listen address (default 127.0.0.1)")
    local.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    local.add_argument(
        "--triton-env",
        type=Path,
        default=Path(".venv-triton"),
        help="virtualenv with nvidia-pytriton and the models' packages (default .venv-triton)",
    )
    local.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    local.add_argument("--workdir", type=Path, default=Path(".triton"), help="Triton's log and backends")
    local.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for Triton")
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["bench"]:  # everything after it is the benchmark's own
        return _bench(given[1:])
    args = _parser().parse_args(given)
    if args.command == "hash-key":
        from gateway.shared.keyfiles import hash_key

        print(hash_key(sys.stdin.readline().strip()))
        return 0
    if args.command == "new-key":
        from gateway.shared.keyfiles import new_key

        try:
            print(new_key(args.keys_file, args.id, args.rate))
        except ConfigurationError as exc:
            print(f"triton-gateway: {exc.detail}", file=sys.stderr)
            return 1
        return 0
    if args.command in ("add-model", "remove-model"):
        return _repository_command(args)
    if args.command == "predictions":
        return _export_predictions(args)
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"triton-gateway: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    from gateway.observe.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format, settings.log_flush_seconds)
    host = (args.host or settings.host) if args.command == "serve" else args.host
    if host != settings.host:
        # the gRPC door listens there too (serve's --host, or local's loopback address)
        settings = settings.model_copy(update={"host": host})
    problem = settings.exposure_problem(host)
    if problem is None and settings.grpc.port and settings.grpc.client_ca_file is None:
        # (with client certificates required, the door authenticates every call itself)
        problem = settings.exposure_problem(settings.grpc_host)
    if problem is not None:
        print(f"triton-gateway: {problem}", file=sys.stderr)
        return 2
    try:
        if args.command == "serve":
            from gateway.app import create_app
            from gateway.http.server import run_server
            from gateway.runtime import Runtime

            runtime = Runtime(settings)
            run_server(
                create_app(settings, runtime=runtime),
                settings,
                host,
                args.port or settings.port,
                runtime.running,
            )
            return 0
        from gateway.dev.local import LocalOptions, run_local

        options = LocalOptions(
            host=args.host,
            port=args.port,
            triton_env=args.triton_env,
            model_repository=args.model_repository,
            workdir=args.workdir,
            ready_timeout=args.ready_timeout,
        )
        return run_local(settings, options)
    except ConfigurationError as exc:
        print(f"triton-gateway: {exc.detail}", file=sys.stderr)
        return 1
    except OSError as exc:  # a port that cannot be listened on, say
        print(f"triton-gateway: {exc}", file=sys.stderr)
        return 1


def _export_predictions(args: argparse.Namespace) -> int:
    """`predictions export`: the Redis sink's records on standard output."""
    import asyncio

    from gateway.shared.streams import export

    try:
        log = Settings().prediction_log if args.url is None or args.prefix is None else None
    except ValidationError as exc:
        print(f"triton-gateway: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    url = args.url or (log.url.get_secret_value() if log else "")
    prefix = args.prefix or (log.stream_prefix if log else "")
    if not url.startswith(("redis://", "rediss://")):
        print(
            "triton-gateway: give the Redis sink's URL: --url redis://... or GATEWAY_PREDICTION_LOG__URL",
            file=sys.stderr,
        )
        return 2

    async def run() -> dict[str, tuple[int, str]]:
        seen: dict[str, tuple[int, str]] = {}
        async for model, entry_id, document in export(url, prefix, args.model, args.since):
            sys.stdout.buffer.write(document + b"\n")
            count, _ = seen.get(model, (0, ""))
            seen[model] = (count + 1, entry_id)
        sys.stdout.flush()
        return seen

    try:
        seen = asyncio.run(run())
    except GatewayError as exc:
        print(f"triton-gateway: {exc.detail}", file=sys.stderr)
        return 1
    for model, (count, last) in sorted(seen.items()):
        print(
            f"{model}: {count} records, the last {last} (resume with --since {last} --model {model})",
            file=sys.stderr,
        )
    return 0


def _repository_command(args: argparse.Namespace) -> int:
    """add-model / remove-model: one line of what was written, or why nothing was (exit 1)."""
    from gateway.modelrepo.repository import ModelRepositoryError, remove_model

    try:
        if args.command == "add-model":
            written = _add_model(args)
            print(
                f"wrote {', '.join(written)} into {args.repository}; load it: POST /admin/models/{args.name}/load"
            )
        else:
            removed = remove_model(args.repository, args.name)
            print(f"removed {', '.join(removed)} from {args.repository}")
    except ModelRepositoryError as exc:
        print(f"triton-gateway {args.command}: {exc.detail}", file=sys.stderr)
        return 1
    return 0


def _refuse_options(args: argparse.Namespace, names: tuple[str, ...], what: str) -> None:
    from gateway.modelrepo.repository import ModelRepositoryError

    given = [
        f"--{name.removesuffix('_name').replace('_', '-')}"
        for name in names
        if getattr(args, name) is not None
    ]
    if given:
        raise ModelRepositoryError(f"{', '.join(given)}: for {what} only")


def _add_model(args: argparse.Namespace) -> list[str]:
    """The model written, then its reference (read first: a bad file writes nothing)."""
    from gateway.modelrepo.reference import ReferenceFileError, attach_reference, read_reference
    from gateway.modelrepo.repository import ModelRepositoryError

    try:
        reference = None if args.reference is None else read_reference(args.reference)
    except ReferenceFileError as exc:
        raise ModelRepositoryError(exc.detail) from exc
    written = _write_model(args)
    if reference is not None:
        attach_reference(args.repository / args.name / "config.pbtxt", reference)
    return written


def _write_model(args: argparse.Namespace) -> list[str]:
    from gateway.modelrepo.imageentry import ImageOptions
    from gateway.modelrepo.repository import (
        ModelRepositoryError,
        add_finetuned_text_classifier,
        add_image_classifier,
        add_text_classifier,
    )
    from gateway.modelrepo.textentry import TextOptions

    image_only = ("normalize", "mean", "std", "input_size", "resize_short_side", "input_name")
    text_only = ("tokenizer", "max_length")
    network = ("onnx", "output_name", "max_batch", "max_top_k", "labels_from")
    labels = args.labels if args.labels is not None else args.labels_from
    if args.task == TEXT_TASK:
        _refuse_options(args, image_only, "image classifiers")
        if args.channel_order != "RGB":
            raise ModelRepositoryError("--channel-order: for image classifiers only")
        if args.onnx is None:  # a zero-shot label set on the shipped encoder
            _refuse_options(args, text_only + network, "your own network (--onnx)")
            if args.activation != DEFAULT_ACTIVATION:
                raise ModelRepositoryError("--activation: for your own network (--onnx) only")
            return add_text_classifier(args.repository, args.name, labels, replace=args.replace)
        if args.tokenizer is None:
            raise ModelRepositoryError(
                "a fine-tuned text classifier needs its tokenizer: --tokenizer tokenizer.json"
            )
        options = TextOptions(
            max_length=args.max_length,
            activation=args.activation,
            output_name=args.output_name,
            max_batch=args.max_batch,
            max_top_k=args.max_top_k,
        )
        return add_finetuned_text_classifier(
            args.repository,
            args.name,
            args.onnx,
            args.tokenizer,
            labels,
            options,
            labels_from_config=args.labels_from is not None,
            replace=args.replace,
        )
    _refuse_options(args, text_only, "fine-tuned text classifiers")
    if args.onnx is None:
        raise ModelRepositoryError("an image classifier needs its network: --onnx FILE")
    if args.labels_from is not None:
        raise ModelRepositoryError("--labels-from: for fine-tuned text classifiers; give images --labels")
    image_options = ImageOptions(
        normalize=args.normalize,
        mean=args.mean,
        std=args.std,
        channel_order=args.channel_order,
        input_size=args.input_size,
        resize_short_side=args.resize_short_side,
        input_name=args.input_name,
        output_name=args.output_name,
        max_batch=args.max_batch,
        max_top_k=args.max_top_k,
        activation=args.activation,
    )
    return add_image_classifier(
        args.repository, args.name, args.onnx, labels, image_options, replace=args.replace
    )


def _bench(options: list[str]) -> int:
    """The side-by-side benchmark (gateway.bench.side_by_side) with ``options``."""
    from gateway.bench.side_by_side import main as bench

    return bench(options)


if __name__ == "__main__":
    sys.exit(main())
