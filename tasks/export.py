"""``ddp-export RUN_DIR``: a run's final (or a chosen) checkpoint's weights as ``model.safetensors`` with
``export.json`` (task, model config, step, loss), from any strategy (fsdp shards consolidated); ``--format hf``
writes a Hugging Face transformers GPT-2 folder for the GPT task (docs/export.md)."""

from __future__ import annotations

import argparse
import sys

PROG = "ddp-export"
EXIT_USAGE = 2


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description="Export a run's trained weights out of its run directory.")
    p.add_argument("source", metavar="RUN_DIR", help="a run directory (its newest complete checkpoint that passes"
                   " its integrity check, as a resume takes it), or a checkpoint step_<N> (any fsspec URL)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this optimizer step (default: newest)")
    p.add_argument("--format", choices=("safetensors", "hf"), default="safetensors",
                   help="safetensors: model.safetensors + export.json; hf: a transformers GPT-2 folder (GPT task)")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/export/step_<N>[-hf])")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Console entry point of ``ddp-export``."""
    from ddp_runner.contract import console_streams, textfit

    console_streams.guard()  # a closed pipe or an ASCII console never ends it (docs/run-tree.md)
    args = parse(sys.argv[1:] if argv is None else argv)
    import yaml

    from ddp_runner.contract import checkpoints
    from ddp_runner.tasks.engine.checkpoint import export

    try:
        found = export.candidates(args.source, args.step)
        for name, why in found.skipped:  # a stray file named step_<N>, a save that never committed
            textfit.say(f"{PROG}: note: {checkpoints.skipped_note(name, why)}", sys.stderr)
        weights, state, url, passed_over = export.load_newest(found)
        for bad, reason in passed_over:  # the newest failed its integrity check: the same fallback as a resume
            textfit.say(f"{PROG}: warning: {checkpoints.fallback_warning(_name(bad), reason, _name(url), 'exporting')}",
                        sys.stderr)
        step = (state.get("progress") or {}).get("step")
        run = url.rstrip("/").rsplit("/", 2)[0] if "/checkpoints/" in url else args.source
        out = args.out or export.default_dir(run, step, args.format)
        data = (yaml.safe_load(state.get("config") or "{}") or {}).get("data") or {}
        files = export.write(weights, state, out, args.format, data_path=data.get("path"))
    except ImportError as exc:
        fix = "pip install 'ddp-runner[hf]'" if args.format == "hf" else f"pip install {exc.name}"
        textfit.say(f"{PROG}: refused: --format {args.format} needs {exc.name}, which is not installed. Fix: {fix}",
                    sys.stderr)
        sys.exit(EXIT_USAGE)
    except (ValueError, OSError, export.storage.CheckpointError) as exc:
        textfit.say(f"{PROG}: refused: {exc}", sys.stderr)
        sys.exit(EXIT_USAGE)
    textfit.say(f"{PROG}: step {step} of {url} -> {out}")
    for f in files:  # a path alone on its line stays whole, for a copy
        print(f"  {f}")


def _name(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


if __name__ == "__main__":
    main()
