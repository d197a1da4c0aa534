"""Write the policy CRDs generated from ``Policy`` (fracpilot_libs.kube.policy_crd) and the
FractionRecommendation CRD (fracpilot_libs.kube.recommendation_crd).

    .venv/bin/python scripts/gen_policy_crds.py          # write them
    .venv/bin/python scripts/gen_policy_crds.py --check  # exit 1 when a file differs

Run it after changing ``Policy``; tests/unit/libs/kube/test_policy_crd.py fails until then.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fracpilot_libs.kube.policy_crd import (
    CLUSTER_KIND,
    CLUSTER_PLURAL,
    GROUP,
    NAMESPACED_KIND,
    NAMESPACED_PLURAL,
    chart_template,
    crd_yaml,
)
from fracpilot_libs.kube.policy_roles import roles_chart_template, roles_yaml
from fracpilot_libs.kube.recommendation_crd import PLURAL as RECOMMENDATION_PLURAL
from fracpilot_libs.kube.recommendation_crd import chart_template as recommendation_template
from fracpilot_libs.kube.recommendation_crd import crd_yaml as recommendation_crd_yaml

ROOT = Path(__file__).resolve().parent.parent


def outputs() -> dict[Path, str]:
    """Each generated file and its content."""
    crds = ROOT / "deploy" / "crds"
    return {
        crds / f"{GROUP}_{NAMESPACED_PLURAL}.yaml": crd_yaml(NAMESPACED_KIND),
        crds / f"{GROUP}_{CLUSTER_PLURAL}.yaml": crd_yaml(CLUSTER_KIND),
        ROOT / "helm" / "fracpilot" / "templates" / "policy-crds.yaml": chart_template(),
        crds / f"{GROUP}_{RECOMMENDATION_PLURAL}.yaml": recommendation_crd_yaml(),
        ROOT / "helm" / "fracpilot" / "templates" / "recommendation-crd.yaml": (
            recommendation_template()
        ),
        ROOT / "deploy" / "rbac" / "policy-roles.yaml": roles_yaml(),
        ROOT / "helm" / "fracpilot" / "files" / "rbac" / "policy-roles.yaml": roles_yaml(),
        ROOT / "helm" / "fracpilot" / "templates" / "policy-roles.yaml": roles_chart_template(),
    }


def main(argv: list[str]) -> int:
    stale = []
    for path, text in outputs().items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in stale:
        sys.stderr.write(f"{path.relative_to(ROOT)} is stale: run scripts/gen_policy_crds.py\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
