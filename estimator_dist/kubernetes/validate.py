"""Every manifest checked against its kind's published schema before it is printed.

* `Service`, `Job`, and the pod templates inside a TFJob, a JobSet and a
  TrainingRuntime: Kubernetes' own OpenAPI schemas for release
  `KUBERNETES_VERSION`, strict (an unknown field is refused), through the
  maintained `kubernetes-validate` package, which ships them.
* `JobSet`, `TrainingRuntime`, `TrainJob`: the Kubeflow Trainer SDK's models
  (`kubeflow_trainer_api`, generated from Trainer's and JobSet's OpenAPI
  specifications). The document is read back into its model and must come out
  unchanged: a field the model does not know, or a value of the wrong type, is
  refused. No CRD schema ships in an installed package, so the CRDs' own
  validation rules (CEL) are not applied.
* `TFJob`: built by the Training SDK's typed models; its pod templates as above.

A refused manifest is an `UsageError` (exit 2) naming the document, the field
and the reason.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from estimator_dist.base.errors import UsageError

#: The Kubernetes release whose schemas the core kinds are checked against: the oldest with
#: every field the manifests use generally available (`backoffLimitPerIndex`, 1.33).
KUBERNETES_VERSION = "1.33"
#: The Trainer SDK's model of each custom kind.
MODELS = {
    "JobSet": "JobsetV1alpha2JobSet",
    "TrainingRuntime": "TrainerV1alpha1TrainingRuntime",
    "TrainJob": "TrainerV1alpha1TrainJob",
}


def validate(documents: Sequence[Dict[str, Any]]) -> None:
    """Checks each document against its kind's schema.

    Raises:
      UsageError: naming the first document and field refused.
    """
    for document in documents:
        kind = document["kind"]
        if kind in MODELS:
            _round_trip(document)
        if kind in ("Service", "Job"):
            _core(document, document)
        for where, template in _pod_templates(document):
            wrapped = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}
            if "spec" in template and "template" in template["spec"]:  # A Job template.
                _core(document, {**wrapped, "spec": template["spec"]}, where)
            else:  # A TFJob replica's pod template.
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"}}
                _core(document, {**wrapped, "template": template}, where)


def _pod_templates(document: Dict[str, Any]) -> list:
    spec = document.get("spec", {})
    if document["kind"] == "TFJob":
        return [
            (f"spec.tfReplicaSpecs.{name}.template", replica["template"])
            for name, replica in spec["tfReplicaSpecs"].items()
        ]
    if document["kind"] == "TrainingRuntime":
        spec, prefix = spec["template"]["spec"], "spec.template.spec."
    elif document["kind"] == "JobSet":
        prefix = "spec."
    else:
        return []
    return [
        (f"{prefix}replicatedJobs[{i}].template", job["template"])
        for i, job in enumerate(spec["replicatedJobs"])
    ]


def _core(document: Dict[str, Any], checked: Dict[str, Any], where: str = "") -> None:
    import kubernetes_validate

    try:
        kubernetes_validate.validate(checked, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path)
        raise _refused(
            document,
            f"{where} as a {checked['kind']}" if where else "",
            f"{path or '(top)'}: {error.message}",
            f"Kubernetes {KUBERNETES_VERSION}'s OpenAPI schema (kubernetes-validate, strict)",
        ) from None


def _round_trip(document: Dict[str, Any]) -> None:
    import pydantic
    from kubeflow_trainer_api import models

    model = getattr(models, MODELS[document["kind"]])
    try:
        back = model.from_dict(document).to_dict()
    except pydantic.ValidationError as error:
        first = error.errors()[0]
        reason = f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
        back = None
    if back is not None:
        if back == document:
            return
        reason = f"fields the model does not know or changed: {_difference(document, back)}"
    raise _refused(document, "", reason, f"the Kubeflow Trainer SDK's {model.__name__}")


def _difference(ours: Any, theirs: Any, path: str = "") -> str:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in ours:
            if key not in theirs:
                return f"{path}{key}"
            if ours[key] != theirs[key]:
                return _difference(ours[key], theirs[key], f"{path}{key}.")
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                return _difference(a, b, f"{path.rstrip('.')}[{i}].")
    return path.rstrip(".") or "(top)"


def _refused(document: Dict[str, Any], where: str, reason: str, schema: str) -> UsageError:
    name = f"{document['kind']} {document.get('metadata', {}).get('name')!r}"
    return UsageError(
        f"the manifest's {name}{' ' + where if where else ''} is refused by {schema}: "
        f"{reason}. Nothing was printed; fix the flag that set this field (--env, --label, "
        "--annotation, --pvc), or report it as a bug of estimator_dist.manifest."
    )
