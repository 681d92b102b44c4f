"""The Kubernetes manifests in deploy/: they parse, hang together and match the broker.

No cluster is needed: every YAML document under deploy/ is loaded with PyYAML and the
references between them (Service -> pods, HPA -> workload, env -> ConfigMap/Secret,
probes -> ports, kustomization -> files) are checked, as is every KAFSCALE_* variable
against the settings the broker really reads (BrokerConfig fields, storage/s3.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from kafscale.broker.config import BrokerConfig

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
S3_SOURCE = REPO / "src" / "kafscale" / "storage" / "s3.py"

REQUIRED_BROKER_ENV = {
    "KAFSCALE_LISTEN",
    "KAFSCALE_ADVERTISE",
    "KAFSCALE_BROKER_ID",
    "KAFSCALE_METADATA",
    "KAFSCALE_STORAGE",
    "KAFSCALE_S3_ENDPOINT",
    "KAFSCALE_HTTP",
}


# ---------------------------------------------------------------------------------------
# loading


def _yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def _load() -> list[tuple[Path, dict]]:
    docs = []
    for path in _yaml_files():
        with path.open() as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((path, doc))
    return docs


@pytest.fixture(scope="module")
def docs() -> list[tuple[Path, dict]]:
    assert DEPLOY.is_dir(), "deploy/ is missing"
    return _load()


@pytest.fixture(scope="module")
def objects(docs) -> list[dict]:
    """Kubernetes objects (everything but kustomizations)."""
    return [d for _, d in docs if d.get("kind") != "Kustomization"]


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected exactly one {kind} {name!r}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def broker_sts(objects) -> dict:
    return one(objects, "StatefulSet", "kafscale-broker")


@pytest.fixture(scope="module")
def broker_container(broker_sts) -> dict:
    containers = broker_sts["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["broker"]
    return containers[0]


def container_env(container: dict, objects: list[dict]) -> dict[str, dict]:
    """Name -> env entry, with envFrom ConfigMap keys resolved as {'value': ...}."""
    env: dict[str, dict] = {}
    for src in container.get("envFrom", []):
        if "configMapRef" in src:
            cm = one(objects, "ConfigMap", src["configMapRef"]["name"])
            for k, v in cm.get("data", {}).items():
                env[src.get("prefix", "") + k] = {"name": k, "value": v, "from": "configmap"}
        elif "secretRef" in src:
            secret = one(objects, "Secret", src["secretRef"]["name"])
            for k in {**secret.get("data", {}), **secret.get("stringData", {})}:
                env[src.get("prefix", "") + k] = {"name": k, "from": "secret"}
    for e in container.get("env", []):
        env[e["name"]] = e  # explicit env wins over envFrom, as in Kubernetes
    return env


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"port {port!r} is not a named port of container {container['name']}: {named}"
    return named[port]


def hostport_port(value: str) -> int:
    return int(value.rsplit(":", 1)[1])


def known_env_names() -> set[str]:
    """KAFSCALE_* names the broker reads: BrokerConfig fields and the S3 store's variables."""
    names = {"KAFSCALE_" + f.name.upper() for f in fields(BrokerConfig)}
    tree = ast.parse(S3_SOURCE.read_text())
    s3 = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"KAFSCALE_S3_[A-Z0-9_]+", n.value)}
    assert {"KAFSCALE_S3_ENDPOINT", "KAFSCALE_S3_CREATE_BUCKET"} <= s3, f"S3 variables found in s3.py: {s3}"
    return names | s3


def all_env_names(objects: list[dict]) -> dict[str, str]:
    """Every environment variable name set anywhere in the manifests -> where."""
    out: dict[str, str] = {}
    for o in objects:
        where = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] == "ConfigMap":
            for k in o.get("data", {}):
                out[k] = where
        if o["kind"] == "Secret":
            for k in {**o.get("data", {}), **o.get("stringData", {})}:
                out[k] = where
        pod = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            for e in c.get("env", []):
                out[e["name"]] = f"{where} container {c['name']}"
    return out


# ---------------------------------------------------------------------------------------
# tests


def test_pyyaml_loads_every_document(docs):
    assert docs, "no YAML documents under deploy/"
    for path, doc in docs:
        assert isinstance(doc, dict), f"{path}: document is not a mapping"
        assert doc.get("apiVersion") and doc.get("kind"), f"{path}: missing apiVersion/kind"
        if doc["kind"] != "Kustomization":
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"


def test_kinds_present(objects):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for expected in [
        ("StatefulSet", "kafscale-broker"),
        ("Service", "kafscale"),
        ("Service", "kafscale-broker-headless"),
        ("HorizontalPodAutoscaler", "kafscale-broker"),
        ("ConfigMap", "kafscale-broker"),
        ("Secret", "kafscale-s3-credentials"),
        ("PodDisruptionBudget", "kafscale-broker"),
        ("StatefulSet", "etcd"),
        ("Service", "etcd"),
        ("Service", "etcd-headless"),
    ]:
        assert expected in kinds, f"missing {expected[0]} {expected[1]}"
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "an object is defined twice"


def test_kustomizations_cover_every_manifest(docs):
    kustomizations = [(p, d) for p, d in docs if d.get("kind") == "Kustomization"]
    assert (DEPLOY / "kustomization.yaml") in [p for p, _ in kustomizations]
    listed: set[Path] = set()
    for path, k in kustomizations:
        for res in k.get("resources", []):
            target = (path.parent / res).resolve()
            assert target.exists(), f"{path}: resource {res} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{path}: {res} is a directory without kustomization.yaml"
            listed.add(target)
    manifests = {p.resolve() for p, d in docs if d.get("kind") != "Kustomization"}
    assert manifests <= listed, f"manifests no kustomization lists: {sorted(str(p) for p in manifests - listed)}"
    # The top-level kustomization reaches the etcd one.
    top = next(d for p, d in kustomizations if p == DEPLOY / "kustomization.yaml")
    assert "etcd/" in top["resources"] or "etcd" in top["resources"]
    assert top.get("namespace"), "the kustomization should put everything in one namespace"


def test_broker_env_has_required_settings(objects, broker_container):
    env = container_env(broker_container, objects)
    missing = REQUIRED_BROKER_ENV - set(env)
    assert not missing, f"broker container lacks {sorted(missing)}"

    assert env["KAFSCALE_LISTEN"]["value"] == "0.0.0.0:9092"
    assert env["KAFSCALE_HTTP"]["value"].startswith("0.0.0.0:")
    # Advertised address from the pod IP (downward API), defined before it is referenced.
    names = [e["name"] for e in broker_container["env"]]
    assert env["KAFSCALE_ADVERTISE"]["value"] == "$(POD_IP):9092"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert names.index("POD_IP") < names.index("KAFSCALE_ADVERTISE"), "$(POD_IP) must be defined before use"
    # Broker id: the StatefulSet ordinal, never a constant shared by all pods.
    bid = env["KAFSCALE_BROKER_ID"]
    assert "value" not in bid, "a fixed KAFSCALE_BROKER_ID would give every pod the same id"
    assert bid["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"

    assert re.fullmatch(r"etcd://[^/]+:\d+(,[^/,]+:\d+)*", env["KAFSCALE_METADATA"]["value"]), env["KAFSCALE_METADATA"]
    assert env["KAFSCALE_STORAGE"]["value"].startswith("s3://")
    assert env["KAFSCALE_S3_ENDPOINT"]["from"] == "configmap"
    # The config parses: ints are ints, booleans are booleans (as the broker's argparse would).
    for name, e in env.items():
        if name.startswith("KAFSCALE_") and "value" in e and name[len("KAFSCALE_") :].lower() in {f.name for f in fields(BrokerConfig)}:
            f = next(f for f in fields(BrokerConfig) if f.name == name[len("KAFSCALE_") :].lower())
            if f.type in (int, "int") and "$(" not in e["value"]:
                int(e["value"])
            if f.type in (bool, "bool"):
                assert e["value"].lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"), (name, e["value"])


def test_ports_and_probes(objects, broker_container):
    env = container_env(broker_container, objects)
    http_port = hostport_port(env["KAFSCALE_HTTP"]["value"])
    kafka_port = hostport_port(env["KAFSCALE_LISTEN"]["value"])
    assert port_number(broker_container, "http") == http_port == 9093
    assert port_number(broker_container, "kafka") == kafka_port == 9092

    live, ready = broker_container["livenessProbe"], broker_container["readinessProbe"]
    assert live["httpGet"]["path"] == "/healthz"
    assert ready["httpGet"]["path"] == "/readyz"
    for probe in (live, ready, broker_container.get("startupProbe")):
        if probe is not None:
            assert port_number(broker_container, probe["httpGet"]["port"]) == http_port, f"probe {probe} not on the http port"


def test_graceful_termination(broker_sts, broker_container):
    pod = broker_sts["spec"]["template"]["spec"]
    # Enough for a flush within the S3 retry budget plus the hand-over in etcd.
    assert pod["terminationGracePeriodSeconds"] >= 15
    assert "preStop" not in broker_container.get("lifecycle", {}), "SIGTERM itself triggers the hand-over"


def test_services_select_broker_pods(objects, broker_sts, broker_container):
    pod_labels = broker_sts["spec"]["template"]["metadata"]["labels"]
    selector = broker_sts["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items(), "StatefulSet selector does not match its pod template"

    client = one(objects, "Service", "kafscale")
    assert client["spec"]["selector"].items() <= pod_labels.items(), "Service kafscale does not select the broker pods"
    (port,) = [p for p in client["spec"]["ports"] if p["port"] == 9092]
    assert port_number(broker_container, port.get("targetPort", 9092)) == 9092

    headless = one(objects, "Service", broker_sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= pod_labels.items()
    assert {port_number(broker_container, p.get("targetPort", p["port"])) for p in headless["spec"]["ports"]} >= {9092, 9093}

    # No other Service selects the brokers by accident (etcd's must not).
    for svc in find(objects, "Service"):
        if svc["metadata"]["name"].startswith("etcd"):
            assert not svc["spec"]["selector"].items() <= pod_labels.items()


def test_hpa_targets_broker_workload(objects, broker_sts, broker_container):
    hpa = one(objects, "HorizontalPodAutoscaler", "kafscale-broker")
    assert hpa["apiVersion"] == "autoscaling/v2"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", broker_sts["kind"], broker_sts["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["minReplicas"] <= broker_sts["spec"]["replicas"] <= hpa["spec"]["maxReplicas"]
    resources = {m["resource"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"}
    for r in resources:  # utilisation targets need requests
        assert r in broker_container["resources"]["requests"], f"HPA scales on {r} but the container requests none"


def test_pdb_selects_brokers(objects, broker_sts):
    pdb = one(objects, "PodDisruptionBudget", "kafscale-broker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= broker_sts["spec"]["template"]["metadata"]["labels"].items()


def test_secret_and_configmap_references_resolve(objects, broker_sts, broker_container):
    pod = broker_sts["spec"]["template"]["spec"]
    secret_refs = [e["valueFrom"]["secretKeyRef"] for e in broker_container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
    secret_refs += [{"name": s["secretRef"]["name"]} for s in broker_container.get("envFrom", []) if "secretRef" in s]
    assert secret_refs, "the broker does not use the S3 credentials Secret"
    for ref in secret_refs:
        secret = one(objects, "Secret", ref["name"])
        keys = {**secret.get("data", {}), **secret.get("stringData", {})}
        if "key" in ref:
            assert ref["key"] in keys, f"Secret {ref['name']} has no key {ref['key']}"
    env = container_env(broker_container, objects)
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(env)

    for src in broker_container.get("envFrom", []):
        if "configMapRef" in src:
            one(objects, "ConfigMap", src["configMapRef"]["name"])
    for e in broker_container.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            assert ref["key"] in one(objects, "ConfigMap", ref["name"]).get("data", {})
    if "serviceAccountName" in pod:
        one(objects, "ServiceAccount", pod["serviceAccountName"])


def test_every_kafscale_variable_is_a_real_setting(objects):
    known = known_env_names()
    used = {name: where for name, where in all_env_names(objects).items() if name.startswith("KAFSCALE_")}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for name in re.findall(r"\b(KAFSCALE_[A-Z0-9_]+)=", dockerfile):
        used.setdefault(name, "Dockerfile")
    assert used, "no KAFSCALE_* variables found"
    unknown = {name: where for name, where in used.items() if name not in known}
    assert not unknown, f"KAFSCALE_* variables the broker does not read: {unknown}"


def test_readme_documents_every_variable(objects):
    readme = (DEPLOY / "README.md").read_text()
    used = [n for n in all_env_names(objects) if n.startswith(("KAFSCALE_", "AWS_"))]
    undocumented = [n for n in used if n not in readme]
    assert not undocumented, f"deploy/README.md does not mention {undocumented}"


def test_etcd_statefulset_and_services(objects, broker_container):
    sts = one(objects, "StatefulSet", "etcd")
    assert sts["spec"]["replicas"] == 3
    labels = sts["spec"]["template"]["metadata"]["labels"]
    headless = one(objects, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"].get("publishNotReadyAddresses") is True
    assert headless["spec"]["selector"].items() <= labels.items()
    (etcd,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in etcd["env"]}
    members = dict(m.split("=", 1) for m in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert sorted(members) == [f"etcd-{i}" for i in range(3)], "initial cluster must list every ordinal"
    for name, url in members.items():
        assert url == f"http://{name}.{headless['metadata']['name']}:2380"
    assert sts["spec"].get("volumeClaimTemplates"), "etcd members need persistent volumes"

    # The broker's KAFSCALE_METADATA points at the etcd client Service.
    md = container_env(broker_container, objects)["KAFSCALE_METADATA"]["value"]
    host, port = md[len("etcd://") :].split(",")[0].rsplit(":", 1)
    client = one(objects, "Service", host.split(".")[0])
    assert client["spec"]["selector"].items() <= labels.items()
    assert int(port) in [p["port"] for p in client["spec"]["ports"]]


def test_dockerfile_builds_the_broker():
    text = (DEPLOY / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    assert re.search(r"pip install [\"']?\.(\[[a-z0-9,]+\])?[\"']?", text), "the image should pip install the project"
    extras = re.search(r"pip install [\"']?\.\[([a-z0-9,]+)\]", text)
    assert extras and {"s3", "etcd"} <= set(extras.group(1).split(",")), "the image needs the s3 and etcd extras"
    assert re.search(r'^ENTRYPOINT \["kafscale"\]', text, re.M)
    assert re.search(r"^USER\s+\S+", text, re.M), "run as a non-root user"
    # Files the build copies exist.
    for src in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", text, re.M):
        for item in src.split():
            assert (REPO / item).exists(), f"Dockerfile copies {item}, which does not exist"
