"""The integer id of each SDCA loss: how the registry names a loss to the numba kernels.

Plain constants (no numba), so the registry, ``topkbench methods`` and ``--help`` can be
imported without compiling or loading any kernel.
"""

LOSS_SVM_MULTI = 0
LOSS_LR_MULTI = 1
LOSS_SVM_OVA = 2
LOSS_LR_OVA = 3
LOSS_TOPK_SVM_ALPHA = 4  # top-k hinge alpha as printed: conjugate domain D_k
LOSS_TOPK_SVM_ALPHA_PSEUDO = 5  # what the authors' code optimizes: Delta_k^alpha
LOSS_TOPK_SVM_BETA = 6  # Delta_k^beta
LOSS_TOPK_ENT = 7
LOSS_SVM_ML = 8
LOSS_LR_ML = 9
LOSS_WTOPK_SVM = 10  # Kato & Hirohashi's weighted top-k hinge (rank weights rho)
