"""Who may change a policy: the ClusterRoles of the policy objects, aggregated to the
standard ones. ``scripts/gen_policy_crds.py`` writes them (deploy/rbac/policy-roles.yaml and the
chart's templates/policy-roles.yaml); a test compares the committed files with these."""

from __future__ import annotations

from typing import Any

import yaml

from fracpilot_libs.kube.policy_crd import CLUSTER_PLURAL, GROUP, HEADER, NAMESPACED_PLURAL

EDIT_ROLE = "fracpilot-policy-edit"
VIEW_ROLE = "fracpilot-policy-view"
_AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def policy_roles() -> list[dict[str, Any]]:
    """``fracpilot-policy-edit`` (aggregated to admin and edit: whoever may edit a namespace
    may change its FractionPolicies) and ``fracpilot-policy-view`` (aggregated to view). The
    ClusterFractionPolicy is read by both and written by neither: changing the cluster
    default is for cluster admins (cluster-admin), and a RoleBinding to ``edit`` in one
    namespace could not grant a cluster-scoped object anyway. Nobody but the actuator writes
    the status."""

    def role(name: str, to: tuple[str, ...], rules: list[dict[str, Any]]) -> dict[str, Any]:
        labels = {"app.kubernetes.io/name": "fracpilot", "app.kubernetes.io/component": "policies"}
        labels |= {f"{_AGGREGATE}{t}": "true" for t in to}
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels},
            "rules": rules,
        }

    read = ["get", "list", "watch"]
    write = ["create", "update", "patch", "delete", "deletecollection"]
    return [
        role(
            EDIT_ROLE,
            ("admin", "edit"),
            [{"apiGroups": [GROUP], "resources": [NAMESPACED_PLURAL], "verbs": read + write}],
        ),
        role(
            VIEW_ROLE,
            ("view",),
            [
                {"apiGroups": [GROUP], "resources": [NAMESPACED_PLURAL], "verbs": list(read)},
                {"apiGroups": [GROUP], "resources": [CLUSTER_PLURAL], "verbs": list(read)},
            ],
        ),
    ]


def roles_yaml() -> str:
    return HEADER + "---\n".join(
        yaml.safe_dump(r, sort_keys=False, width=100) for r in policy_roles()
    )


def roles_chart_template() -> str:
    """The roles as the chart's template (``fractionPolicies.roles``), with its labels."""
    docs = []
    for r in policy_roles():
        name = r["metadata"]["name"]
        aggregate = {k: v for k, v in r["metadata"]["labels"].items() if k.startswith(_AGGREGATE)}
        meta = (
            f"metadata:\n  name: {name}\n  labels:\n"
            '    {{- include "fracpilot.labels" (list $ "policies") | nindent 4 }}\n'
            + "".join(f'    {k}: "{v}"\n' for k, v in aggregate.items())
        )
        body = yaml.safe_dump({"rules": r["rules"]}, sort_keys=False, width=100)
        docs.append(f"apiVersion: {r['apiVersion']}\nkind: {r['kind']}\n{meta}{body}")
    return (
        "{{- /* " + HEADER.strip("# \n") + " */}}\n"
        "{{- if .Values.fractionPolicies.roles }}\n---\n" + "---\n".join(docs) + "{{- end }}\n"
    )
