"""The single registry of training methods (DESIGN §3, STYLE.md "Shape of the package").

``topkbench methods``, ``--help`` texts and parameter validation are generated from it.
Only methods whose solver exists are registered.
"""

from __future__ import annotations

from dataclasses import dataclass

from topkbench.errors import ConfigError
from topkbench.losses import ids as _k


@dataclass(frozen=True)
class MethodSpec:
    """One training method: a loss plus the solver that certifies it."""

    name: str
    paper_name: str
    task: str  # "multiclass" | "multilabel"
    solver: str  # "sdca" | ...
    loss_id: int
    params: tuple[str, ...]  # parameters the method takes besides C
    objective: str  # one-line loss formula
    reference: str  # paper file, section, equation
    aliases: tuple[str, ...] = ()
    smooth_when: str = ""  # when the loss is smooth (for documentation)


_MULTI_SVM = MethodSpec(
    name="svm_multi",
    paper_name="SVM^Multi (Crammer-Singer); smooth SVM^Multi_gamma for gamma > 0",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_SVM_MULTI,
    params=("gamma",),
    objective="max_j {a_j + c_j}, a_j = f_j - f_y, c = 1 - e_y; Moreau-smoothed for gamma > 0",
    reference="TPAMI 002 §3.2, Table 1, Prop. 2 (k=1), Prop. 14 (k=1)",
    aliases=("multiclass_svm", "cs_svm", "top1_svm"),
    smooth_when="gamma > 0",
)
_MULTI_LR = MethodSpec(
    name="lr_multi",
    paper_name="LR^Multi (softmax / cross entropy)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_LR_MULTI,
    params=(),
    objective="log sum_j exp(a_j), a_j = f_j - f_y",
    reference="TPAMI 002 §3.2, Prop. 3, Props. 15-16 (k=1), eq. (14)",
    aliases=("softmax", "multinomial_lr"),
    smooth_when="always",
)
_OVA_SVM = MethodSpec(
    name="svm_ova",
    paper_name="SVM^OVA (one-vs-all hinge); smooth SVM^OVA_gamma for gamma > 0",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_SVM_OVA,
    params=("gamma",),
    objective="sum_c max{0, 1 - yt_c f_c}, yt_c = +1 if c = y else -1; smoothed for gamma>0",
    reference="TPAMI 002 §3.2 (OVA), Prop. 10, §5.2",
    aliases=("ova_svm",),
    smooth_when="gamma > 0",
)
_OVA_LR = MethodSpec(
    name="lr_ova",
    paper_name="LR^OVA (one-vs-all logistic regression)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_LR_OVA,
    params=(),
    objective="sum_c log(1 + exp(-ytilde_c f_c))",
    reference="TPAMI 002 §3.2 (OVA), Prop. 9, §5.2",
    aliases=("ova_lr",),
    smooth_when="always",
)

_TOPK_ALPHA = MethodSpec(
    name="topk_svm_alpha",
    paper_name="top-k SVM^alpha exactly as printed in TPAMI Table 1 (smooth for gamma > 0)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_TOPK_SVM_ALPHA,
    params=("k", "gamma"),
    objective="(1/k) max{0, T_{k-1}(z), T_k(z)}, z = (a + c)^{\\y}, T_j = sum of j largest",
    reference="TPAMI 002 Table 1, Props. 1-2, 14 with the domain D_k of DESIGN §4.1",
    aliases=("topk_svm", "topk_alpha"),
    smooth_when="gamma > 0",
)
_TOPK_ALPHA_PSEUDO = MethodSpec(
    name="topk_svm_alpha_pseudo",
    paper_name="top-k SVM^alpha as optimized by the authors' code (Kato's 'pseudo' alpha)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_TOPK_SVM_ALPHA_PSEUDO,
    params=("k", "gamma"),
    objective="(1/k) max{0, T_k(z)}, z = (a + c)^{\\y}; conjugate domain Delta_k^alpha",
    reference="NIPS 001 §4 (Delta_k^alpha); Kato 004 §8; DESIGN §4.1",
    aliases=("topk_alpha_pseudo", "pseudo_alpha"),
    smooth_when="gamma > 0",
)
_TOPK_BETA = MethodSpec(
    name="topk_svm_beta",
    paper_name="top-k SVM^beta (smooth for gamma > 0)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_TOPK_SVM_BETA,
    params=("k", "gamma"),
    objective="(1/k) sum_{j<=k} max{0, z_[j]}, z = (a + c)^{\\y}",
    reference="TPAMI 002 Table 1, eq. (3), Prop. 14; NIPS 001 §4 supplement; DESIGN §4.5",
    aliases=("topk_beta",),
    smooth_when="gamma > 0",
)
_TOPK_ENT = MethodSpec(
    name="topk_ent",
    paper_name="top-k Ent (top-k entropy)",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_TOPK_ENT,
    params=("k",),
    objective="max_{x in Delta_k^alpha} <a^{\\y}, x> + H(x) + H(1 - <1,x>)",
    reference="TPAMI 002 Prop. 4, Props. 15-17, eqs. (11)-(16); DESIGN §4.2",
    aliases=("topk_entropy",),
    smooth_when="always",
)
_TOPK_ENT_TR = MethodSpec(
    name="topk_ent_tr",
    paper_name="truncated top-k Ent (nonconvex)",
    task="multiclass",
    solver="lbfgs",
    loss_id=-1,
    params=("k",),
    objective="log(1 + sum_{j in J} exp(a_j)), J = the m-k smallest f_j, j != y",
    reference="TPAMI 002 §3.2 (top-k Ent_tr), §6.2 (start from LR^Multi)",
    aliases=("topk_entropy_truncated", "ent_tr"),
    smooth_when="almost everywhere (nonconvex; no duality gap)",
)

_ML_SVM = MethodSpec(
    name="svm_ml",
    paper_name="SVM^ML (multilabel SVM); smooth SVM^ML_gamma for gamma > 0",
    task="multilabel",
    solver="sdca",
    loss_id=_k.LOSS_SVM_ML,
    params=("gamma",),
    objective="max{0, 1 + max_{j not in Y} f_j - min_{y in Y} f_y}; smoothed over all m coords",
    reference="TPAMI 002 §3.3, Props. 5-6, Prop. 18, §5.3 eq. (17) (bipartite simplex)",
    aliases=("multilabel_svm", "ml_svm"),
    smooth_when="gamma > 0",
)
_ML_LR = MethodSpec(
    name="lr_ml",
    paper_name="LR^ML (multilabel cross entropy)",
    task="multilabel",
    solver="sdca",
    loss_id=_k.LOSS_LR_ML,
    params=(),
    objective="log sum_j exp(f_j) - (1/|Y|) sum_{y in Y} f_y",
    reference="TPAMI 002 §3.3 (LR^ML), Prop. 7, Prop. 20, eq. (19)",
    aliases=("multilabel_lr", "ml_lr", "ml_softmax"),
    smooth_when="always",
)

_WTOPK = MethodSpec(
    name="wtopk_svm",
    paper_name="weighted top-k SVM (Kato & Hirohashi); flat weights = top-k SVM^alpha as printed",
    task="multiclass",
    solver="sdca",
    loss_id=_k.LOSS_WTOPK_SVM,
    params=("k", "gamma", "weights", "fw"),
    objective="max{0, sum_r rho_r c_[r]}, c = 1 - e_y + f - f_y 1 (all m sorted); "
    "Moreau-smoothed over all m coordinates for gamma > 0; fw=standard|away|pairwise solves it "
    "by Frank-Wolfe instead of SDCA",
    reference="Kato 004 §4 eq. (8), §5 (Frank-Wolfe), §6 eq. (25); SDCA by the permutahedron "
    "projection (topkbench.prox.permutahedron)",
    aliases=("weighted_topk_svm", "wtopk"),
    smooth_when="gamma > 0",
)

METHODS: dict[str, MethodSpec] = {
    s.name: s
    for s in (
        _OVA_SVM,
        _OVA_LR,
        _MULTI_SVM,
        _MULTI_LR,
        _TOPK_ALPHA,
        _TOPK_ALPHA_PSEUDO,
        _TOPK_BETA,
        _TOPK_ENT,
        _TOPK_ENT_TR,
        _ML_SVM,
        _ML_LR,
        _WTOPK,
    )
}
_ALIASES: dict[str, str] = {a: s.name for s in METHODS.values() for a in s.aliases}


def available_methods() -> list[str]:
    return list(METHODS)


def get_method(name: str) -> MethodSpec:
    """Look a method up by name or alias; unknown names list the valid ones."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in METHODS:
        raise ConfigError(
            f"unknown method {name!r}. Available methods are: {', '.join(METHODS)}",
            hint="topkbench methods",
        )
    return METHODS[key]
