"""``ddp-run launcher=kubernetes`` on the workstation (main() in this process): the manifests it writes from a real
command line, checked against the CRDs' schemas (and by ``kubectl apply --dry-run=client`` where kubectl is
installed), and its refusals. Nothing is launched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

SCHEMAS = yaml.safe_load((Path(__file__).parents[1] / "support" / "kubeflow_crds.yaml").read_text())
K8S = ["task=smoke", "world_size=4", "launcher=kubernetes", "launcher.nodes=2", "launcher.job_name=exp42",
       "launcher.image=registry.example/ddp:1", "launcher.volume=runs-pvc"]


def write(cli, tmp_path: Path, *extra: str, root: str = "/runs"):
    return cli([*K8S, *extra, f"launcher.manifest_dir={tmp_path / 'k8s'}"], root)


def test_the_manifests_of_a_command_line_are_valid_and_run_it_as_pods(cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the manifests (mlflow installs it)")
    r = write(cli, tmp_path, "device=cpu", "launcher.env={NCCL_DEBUG:INFO}", "launcher.secret=s3-creds")
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "k8s" / "exp42"
    assert sorted(p.name for p in folder.iterdir()) == ["pytorchjob.yaml", "trainjob.yaml"]
    assert f"kubectl apply -f {folder / 'trainjob.yaml'}" in r.stdout
    assert "node 0's pod opens the run directory /runs/exp42_smoke_w4" in r.stdout
    docs = [d for f in ("trainjob.yaml", "pytorchjob.yaml") for d in yaml.safe_load_all((folder / f).read_text())]
    assert [d["kind"] for d in docs] == ["TrainingRuntime", "TrainJob", "PyTorchJob"]
    for doc in docs:
        errors = [e.message for e in jsonschema.Draft7Validator(SCHEMAS[doc["kind"]]).iter_errors(doc)]
        assert not errors, (doc["kind"], errors)
    _, job, v1 = docs
    trainer = job["spec"]["trainer"]
    # Every pod runs this command line again, as a pod of the job, with SIGTERM (Kubernetes' stop) as the
    # pre-emption signal; the workstation's own keys stay behind.
    assert trainer["args"] == ["task=smoke", "world_size=4", "launcher=kubernetes", "launcher.nodes=2",
                               "launcher.job_name=exp42", "launcher.image=registry.example/ddp:1",
                               "launcher.volume=runs-pvc", "device=cpu", "launcher.env={NCCL_DEBUG:INFO}",
                               "launcher.secret=s3-creds", "output.root=/runs", "checkpoint.stop_signal=SIGTERM",
                               "launcher.role=pod"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 2)
    assert "resourcesPerNode" not in trainer, "device=cpu: no GPU asked for"
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in trainer["env"]
    master = v1["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert master["args"] == trainer["args"] and v1["spec"]["nprocPerNode"] == "2"
    assert not list(tmp_path.glob("runs*")), "nothing but the manifests is made"


def _kubectl_knows(group: str) -> bool:
    """Does kubectl reach a cluster that serves the CRDs of API ``group``? (Even a client dry run maps each kind
    through the cluster's discovery: without one, kubectl cannot recognise a TrainJob.)"""
    r = subprocess.run(["kubectl", "api-resources", f"--api-group={group}", "-o", "name", "--request-timeout=5s"],
                       capture_output=True, text=True, timeout=60)
    return r.returncode == 0 and bool(r.stdout.strip())


@pytest.mark.parametrize(("name", "group"), [("trainjob.yaml", "trainer.kubeflow.org"),
                                             ("pytorchjob.yaml", "kubeflow.org")])
def test_kubectl_accepts_the_manifests(cli, tmp_path, name, group):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the manifests are checked against the CRDs' schemas only")
    if not _kubectl_knows(group):
        pytest.skip(f"kubectl reaches no cluster serving {group}'s CRDs, which even --dry-run=client needs to"
                    " recognise the kinds: the manifests are checked against the CRDs' schemas only")
    assert write(cli, tmp_path).returncode == 0
    r = subprocess.run(["kubectl", "apply", "--dry-run=client", "-f", str(tmp_path / "k8s" / "exp42" / name)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(("extra", "root", "says"), [
    ((), "outputs", "output.root"),
    (("launcher.volume=null",), "/runs", "launcher.volume=<claim>"),
    (("launcher.job_name=Exp_42",), "/runs", "launcher.job_name"),
    (("launcher.termination_grace_s=20",), "/runs", "launcher.termination_grace_s=39"),
    (("launcher.nodes=3",), "/runs", "world_size"),
])
def test_a_job_the_pods_could_not_run_is_refused_before_anything_is_written(cli, tmp_path, extra, root, says):
    r = write(cli, tmp_path, *extra, root=root)
    assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (tmp_path / "k8s").exists()


@pytest.mark.parametrize("dry_run", ["false", "true"])
def test_credentials_in_the_command_line_never_reach_the_manifests(cli, tmp_path, dry_run):
    r = write(cli, tmp_path, "launcher.volume=null", f"dry_run={dry_run}", root="s3://AKIAEXAMPLE:topsecret@bucket/runs")
    assert r.returncode == 2 and "launcher.secret" in r.stderr and "topsecret" not in r.stderr + r.stdout
    assert not (tmp_path / "k8s").exists()


def test_a_pod_outside_kubernetes_is_refused_naming_the_missing_variable(cli, tmp_path):
    r = cli([*K8S, "launcher.role=pod"], str(tmp_path / "runs"))
    assert r.returncode == 2 and "PET_NNODES" in r.stderr, r.stderr
