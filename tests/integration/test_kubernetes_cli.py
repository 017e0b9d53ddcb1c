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


def write(cli, tmp_path: Path, *extra: str, root: str = "/runs", env: dict[str, str] | None = None):
    return cli([*K8S, *extra, f"launcher.manifest_dir={tmp_path / 'k8s'}"], root, env)


def test_the_manifests_of_a_command_line_are_valid_and_run_it_as_pods(cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the manifests (mlflow installs it)")
    r = write(cli, tmp_path, "device=cpu", "launcher.env={NCCL_DEBUG:INFO}", "launcher.secret=s3-creds")
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "k8s" / "exp42"
    assert sorted(p.name for p in folder.iterdir()) == ["pytorchjob.yaml", "trainingruntime.yaml", "trainjob.yaml"]
    assert f"kubectl apply -f {folder / 'trainjob.yaml'}" in r.stdout
    assert "node 0's pod opens the run directory /runs/exp42_smoke_w4" in r.stdout
    docs = [d for f in ("trainingruntime.yaml", "trainjob.yaml", "pytorchjob.yaml")
            for d in yaml.safe_load_all((folder / f).read_text())]
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
                               "launcher.volume=runs-pvc", "device=cpu",
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


@pytest.mark.parametrize(("name", "group"), [("trainingruntime.yaml", "trainer.kubeflow.org"),
                                             ("trainjob.yaml", "trainer.kubeflow.org"),
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
@pytest.mark.parametrize("root", ["s3://AKIAEXAMPLE:topsecret@bucket/runs",
                                  "'s3://bucket/runs?aws_secret_access_key=topsecret'"])
def test_credentials_in_the_command_line_never_reach_the_manifests(cli, tmp_path, dry_run, root):
    r = write(cli, tmp_path, "launcher.volume=null", f"dry_run={dry_run}", root=root)
    assert r.returncode == 2 and "launcher.secret" in r.stderr and "topsecret" not in r.stderr + r.stdout
    assert not (tmp_path / "k8s").exists()


def _written(folder: Path) -> str:
    return "".join(p.read_text() for p in folder.iterdir())


@pytest.mark.parametrize("given", ["'launcher.env={HF_TOKEN:${oc.env:MYTOK}}'", "launcher.env={HF_TOKEN:hf_typed123}"])
def test_a_secret_of_launcher_env_reaches_the_pods_only_through_a_secret(cli, tmp_path, given):
    token = "hf_fromenv456" if "oc.env" in given else "hf_typed123"
    r = write(cli, tmp_path, given.strip("'"), env={"MYTOK": "hf_fromenv456"})
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "k8s" / "exp42"
    assert token not in r.stdout + r.stderr, "never echoed"
    jobs = {n: (folder / n).read_text() for n in ("trainingruntime.yaml", "trainjob.yaml", "pytorchjob.yaml")}
    assert not any(token in text for text in jobs.values()), "no manifest holds it, in args or env.value"
    ref = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "exp42-env", "key": "HF_TOKEN"}}}
    [job] = yaml.safe_load_all(jobs["trainjob.yaml"])
    [v1] = yaml.safe_load_all(jobs["pytorchjob.yaml"])
    assert ref in job["spec"]["trainer"]["env"]
    assert ref in v1["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert not any("launcher.env" in a for a in job["spec"]["trainer"]["args"])
    secret = folder / "secret.yaml"
    assert secret.stat().st_mode & 0o777 == 0o600
    [doc] = yaml.safe_load_all(secret.read_text())
    assert doc["kind"] == "Secret" and doc["stringData"] == {"HF_TOKEN": token}
    assert f"wrote {secret} (mode 0600): a Secret exp42-env holding HF_TOKEN" in r.stdout
    assert f"kubectl apply -f {secret} && kubectl apply -f {folder / 'pytorchjob.yaml'}" in r.stdout


def test_a_secret_typed_into_launcher_env_is_masked_in_a_dry_run(cli, tmp_path):
    r = write(cli, tmp_path, "launcher.env={API_KEY:typedsecret99,NCCL_DEBUG:INFO}", "dry_run=true")
    assert r.returncode == 0, r.stderr
    assert "typedsecret99" not in r.stdout + r.stderr and "API_KEY:***" in r.stdout, r.stdout


def test_the_grace_period_reaches_both_manifests(cli, tmp_path):
    assert write(cli, tmp_path, "launcher.termination_grace_s=120").returncode == 0
    folder = tmp_path / "k8s" / "exp42"
    [runtime] = yaml.safe_load_all((folder / "trainingruntime.yaml").read_text())
    [v1] = yaml.safe_load_all((folder / "pytorchjob.yaml").read_text())
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    for replica in v1["spec"]["pytorchReplicaSpecs"].values():
        assert replica["template"]["spec"]["terminationGracePeriodSeconds"] == 120


@pytest.mark.parametrize(("extra", "says"), [
    (("launcher.env={MASTER_ADDR:x}",), "launcher.env.MASTER_ADDR"),
    (("launcher.env={PET_NODE_RANK:1}",), "launcher.env.PET_NODE_RANK"),
    (("launcher.env={POD_IP:1.2.3.4}",), "launcher.env.POD_IP"),
    (("launcher.cpu_per_node=-3",), "launcher.cpu_per_node=-3"),
    (("launcher.memory_per_node=lots",), "launcher.memory_per_node='lots'"),
    (("launcher.restart_policy=Never",), "launcher.restart_policy"),
    (("launcher.manifest_dir=/proc/nope",), "launcher.manifest_dir='/proc/nope'"),
])
def test_input_the_pods_cannot_take_is_refused_naming_the_key(cli, tmp_path, extra, says):
    args = [*K8S, *extra] if "manifest_dir" in extra[0] else [*K8S, *extra, f"launcher.manifest_dir={tmp_path / 'k8s'}"]
    r = cli(args, "/runs")
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "k8s").exists()


def test_a_config_dir_of_the_command_line_is_carried_to_every_pod(cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the manifests (mlflow installs it)")
    conf = tmp_path / "conf"
    (conf / "task").mkdir(parents=True)
    (conf / "task" / "mysmoke.yaml").write_text("defaults:\n  - smoke\n  - _self_\nname: mysmoke\n")
    r = cli(["--config-dir", str(conf), *K8S, "task=mysmoke", "device=cpu",
             f"launcher.manifest_dir={tmp_path / 'k8s'}"], "/runs")
    assert r.returncode == 0, r.stdout + r.stderr
    folder = tmp_path / "k8s" / "exp42"
    docs = {d["kind"]: d for f in ("configmap.yaml", "trainingruntime.yaml", "trainjob.yaml", "pytorchjob.yaml")
            for d in yaml.safe_load_all((folder / f).read_text())}
    for doc in docs.values():
        assert not list(jsonschema.Draft7Validator(SCHEMAS[doc["kind"]]).iter_errors(doc)), doc["kind"]
    assert f"wrote {folder / 'configmap.yaml'}: a ConfigMap exp42-conf of --config-dir" in r.stdout
    assert f"kubectl apply -f {folder / 'configmap.yaml'} && kubectl apply -f {folder / 'pytorchjob.yaml'}" in r.stdout
    args = docs["TrainJob"]["spec"]["trainer"]["args"]
    assert args[:2] == ["--config-dir", "/etc/ddp-runner/conf"] and "task=mysmoke" in args
    pod = docs["TrainingRuntime"]["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    [volume] = pod["spec"]["volumes"][1:]
    assert volume["configMap"]["name"] == "exp42-conf"
    assert {"name": "conf", "mountPath": "/etc/ddp-runner/conf", "readOnly": True} in pod["spec"]["containers"][0][
        "volumeMounts"]
    master = docs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["args"] == args and volume in master["volumes"]
    # The pod's view: the ConfigMap's files at their paths under the mount; its command composes task=mysmoke.
    mount = tmp_path / "mount"
    for item in volume["configMap"]["items"]:
        (mount / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (mount / item["path"]).write_text(docs["ConfigMap"]["data"][item["key"]])
    pod_args = [str(mount) if a == "/etc/ddp-runner/conf" else a for a in args if not a.startswith("output.root=")]
    env = {"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "127.0.0.1",
           "PET_MASTER_PORT": "29500", "POD_IP": "127.0.0.1"}
    r = cli([*pod_args, "dry_run=true"], "/runs", env)
    assert r.returncode == 0 and "mysmoke" in r.stdout, r.stdout + r.stderr


def test_the_printed_submit_command_applies_the_runtime_waits_and_retries_the_job(cli, tmp_path):
    # kubectl stands in as a script: it logs its calls and rejects the first TrainJob apply, as the webhook does
    # while its cache has not seen the runtime.
    assert write(cli, tmp_path, "launcher.namespace=ml").returncode == 0
    r = write(cli, tmp_path, "launcher.namespace=ml")
    [line] = [x.strip() for x in r.stdout.splitlines() if "trainingruntime.yaml &&" in x]
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(f"""#!/bin/sh
echo "$*" >> {log}
case "$*" in *trainjob.yaml*) [ -e {tmp_path}/seen ] && exit 0; touch {tmp_path}/seen; exit 1;; esac
""")
    (bin_dir / "kubectl").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", line.replace("sleep 3", "sleep 0")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "k8s" / "exp42"
    assert log.read_text().splitlines() == [
        f"apply -f {folder / 'trainingruntime.yaml'}",
        "wait --for=create --timeout=60s -n ml trainingruntime.trainer.kubeflow.org/exp42",
        f"apply -f {folder / 'trainjob.yaml'}", f"apply -f {folder / 'trainjob.yaml'}"]


def test_a_pod_outside_kubernetes_is_refused_naming_the_missing_variable(cli, tmp_path):
    r = cli([*K8S, "launcher.role=pod"], str(tmp_path / "runs"))
    assert r.returncode == 2 and "PET_NNODES" in r.stderr, r.stderr


@pytest.mark.parametrize(("nodes", "says"), [("3", "not divisible by launcher.nodes=3"), ("0", "launcher.nodes=0")])
def test_node_count_refusals_name_launcher_nodes_the_key_given(cli, tmp_path, nodes, says):
    r = write(cli, tmp_path, f"launcher.nodes={nodes}")
    assert r.returncode == 2 and says in r.stderr and "launcher.nnodes" not in r.stderr, r.stderr


def test_the_submit_lines_say_to_delete_a_finished_job_first(cli, tmp_path):
    r = write(cli, tmp_path)
    assert "a finished job of this name: kubectl delete it first" in r.stdout, r.stdout
