"""Networks trained with the registry's losses: TPAMI Table 6's fine-tuning protocol
(:mod:`topkbench.deep.protocol`).  :mod:`topkbench.deep.config` reads its configuration
without torch; the rest needs the extra ``topkbench[torch]``."""
