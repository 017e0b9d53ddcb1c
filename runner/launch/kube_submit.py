"""launcher=kubernetes on the workstation: the job's files in ``<manifest_dir>/<job_name>/`` and the one command
that submits them in an order that works.

Kubeflow Trainer v2's admission webhook reads the TrainJob's runtime from its informer cache
(kubeflow/trainer ``pkg/runtime/core/trainingruntime.go``: "specified trainingRuntime must be created before the
TrainJob is created"), so a runtime applied in the same ``kubectl apply`` as its TrainJob can be unknown to it for
a moment. The runtime therefore has its own file: apply it, wait until the API server has it, then apply the
TrainJob, again a few times while the webhook's cache catches up. The job's Secret (a secret of ``launcher.env``)
goes first, in an owner-only file.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from ddp_runner.launch import kube_manifest as km

TRIES, PAUSE_S = 10, 3  # the TrainJob's apply, while the webhook's cache learns of the runtime


def write_owner_only(path: Path, text: str) -> None:
    """``text`` in a file only its owner reads: 0600 from its creation (an earlier one is removed first, so that
    the mode is this one), never readable by others for a moment."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def v2_command(folder: Path, spec: km.PodSpec, first: Sequence[Path]) -> str:
    """The shell line that submits the TrainJob: ``first`` (the ConfigMap, the Secret), the runtime, a wait for
    it, the job (retried)."""
    ns = ["-n", spec.namespace] if spec.namespace else []
    q = shlex.quote
    runtime, job = q(str(folder / "trainingruntime.yaml")), q(str(folder / "trainjob.yaml"))
    steps = [f"kubectl apply -f {q(str(f))}" for f in first]
    steps += [f"kubectl apply -f {runtime}",
              shlex.join(["kubectl", "wait", "--for=create", "--timeout=60s", *ns,
                          f"trainingruntime.{km.TRAINER_GROUP}/{spec.name}"]),
              f"for i in $(seq {TRIES}); do kubectl apply -f {job} && break; sleep {PAUSE_S}; done"]
    return " && ".join(steps[:-1]) + " && { " + steps[-1] + "; }"


def v1_command(folder: Path, first: Sequence[Path]) -> str:
    """The shell line that submits the PyTorchJob (after ``first``: the ConfigMap, the Secret)."""
    q = shlex.quote
    return " && ".join([*(f"kubectl apply -f {q(str(f))}" for f in first),
                        f"kubectl apply -f {q(str(folder / 'pytorchjob.yaml'))}"])


def write(folder: Path, spec: km.PodSpec, head: Sequence[str]) -> dict[str, Path]:
    """Write the job's files; returns them by role (``secret`` only when ``launcher.env`` holds one)."""
    files = {"runtime": folder / "trainingruntime.yaml", "trainjob": folder / "trainjob.yaml",
             "pytorchjob": folder / "pytorchjob.yaml"}
    files["runtime"].write_text(km.to_yaml([km.training_runtime(spec)], [
        *head, "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): the TrainingRuntime, applied before the"
        " TrainJob."]))
    files["trainjob"].write_text(km.to_yaml([km.train_job(spec)], [
        *head, "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): the TrainJob; its runtime is"
        " trainingruntime.yaml, applied first."]))
    files["pytorchjob"].write_text(km.to_yaml([km.pytorch_job(spec)], [
        *head, "Kubeflow Training Operator v1 (kubeflow.org/v1): PyTorchJob."]))
    config_map = folder / "configmap.yaml"
    if spec.config_files:
        config_map.write_text(km.to_yaml([km.config_map(spec)], [
            "The command line's --config-dir, mounted in every pod; apply it before the job."]))
        files["configmap"] = config_map
    else:
        config_map.unlink(missing_ok=True)
    secret = folder / "secret.yaml"
    if spec.secret_env:
        write_owner_only(secret, km.to_yaml([km.env_secret(spec)], [
            "A Secret with the values of launcher.env's secrets: keep this file to yourself; apply it before the"
            " job."]))
        files["secret"] = secret
    else:
        secret.unlink(missing_ok=True)  # an earlier command's, not this job's
    return files


def written_lines(files: Mapping[str, Path], spec: km.PodSpec, conf_dir: str | None = None) -> list[str]:
    """What the console says after writing: the files (the Secret's names, never its values)."""
    secret = files.get("secret")
    out = [f"ddp-run: wrote {files['runtime']} + {files['trainjob']} (Kubeflow Trainer v2: TrainingRuntime,"
           f" TrainJob) and {files['pytorchjob']} (Training Operator v1: PyTorchJob)"]
    if "configmap" in files:
        out.append(f"ddp-run: wrote {files['configmap']}: a ConfigMap {spec.config_map_name} of --config-dir"
                   f" {conf_dir} ({len(spec.config_files)} file(s)), mounted at {km.CONF_MOUNT} in every pod, whose"
                   " command names it")
    if secret is not None:
        out.append(f"ddp-run: wrote {secret} (mode 0600): a Secret {spec.env_secret} holding"
                   f" {', '.join(spec.secret_env)}, which the pods read through secretKeyRef; no manifest holds"
                   " their values. Keep the file to yourself.")
    return out


def submit_lines(files: Mapping[str, Path], spec: km.PodSpec) -> list[str]:
    """The commands that submit the job, in an order that works."""
    folder, first = files["trainjob"].parent, [files[k] for k in ("configmap", "secret") if k in files]
    return ["ddp-run: submit the job with one of (a finished job of this name: kubectl delete it first):",
            f"  {v2_command(folder, spec, first)}", f"  {v1_command(folder, first)}"]

