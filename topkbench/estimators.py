"""scikit-learn estimators over :func:`topkbench.fit`.

``TopKClassifier`` covers every multiclass method of the registry and ``MultilabelClassifier``
the multilabel ones (``svm_ml``, ``lr_ml``).  Both minimize the objective of DESIGN §2,

    P(W) = lambda/2 ||W||^2 + 1/n sum_i L(y_i, W^T x_i),   C = 1/(lambda n),

and keep the certificate of the fit (``dual_gap_``, ``status_``).  There is no intercept:
as in the papers (DESIGN §2) a bias is a constant feature the user appends.

Importing this module loads scikit-learn but not numba; the solvers load on the first ``fit``.

Probabilities (``predict_proba``) exist only where the loss is proper, i.e. its minimizer
estimates p_y(x) = Pr(Y = y | X = x) (TPAMI 002 §4.1, the remark after Prop. 12): the
softmax loss (``lr_multi``, and ``topk_ent`` at k = 1, which is the same loss) gives
softmax(f), and OVA logistic regression (``lr_ova``, Prop. 9) gives sigmoid(f_c) for each
class, normalized to sum to one.  The hinges are piecewise linear; their minimizers are
piecewise constant in p and carry no probability (Props. 8 and 11), and the top-k losses for
k > 1 only identify the top-k set (Lemma 1), so those estimators have no ``predict_proba``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.metrics import top_k_accuracy_score
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from topkbench.errors import ConfigError
from topkbench.losses.registry import get_method

__all__ = ["TopKClassifier", "MultilabelClassifier", "top_k_scorer"]

_KERNELS = ("linear", "rbf")


def _fingerprint(X, y, weights=None) -> str:
    """A hash of the training data (features, targets, sample weights)."""
    h = hashlib.blake2b(digest_size=16)
    if sp.issparse(X):
        for part in (X.indptr, X.indices, X.data):
            h.update(np.ascontiguousarray(part).tobytes())
    else:
        h.update(np.ascontiguousarray(X).tobytes())
    h.update(repr(X.shape).encode())
    y = y.toarray() if sp.issparse(y) else np.asarray(y)
    h.update(np.ascontiguousarray(y).tobytes())
    if weights is not None:
        h.update(np.ascontiguousarray(weights).tobytes())
    return h.hexdigest()


class _TopkbenchEstimator(BaseEstimator):
    """What both estimators share: validation, the call to :func:`topkbench.fit`, the fitted
    attributes, warm starts and the decision function."""

    _task = ""

    def _spec(self):
        spec = get_method(self.method)
        if spec.task != self._task:
            raise ConfigError(
                f"{type(self).__name__} takes a {self._task} method; {spec.name} is {spec.task}"
            )
        if self.kernel not in _KERNELS:
            raise ConfigError(f"kernel must be one of {', '.join(_KERNELS)}; got {self.kernel!r}")
        return spec

    def _fit(self, X, targets, n_classes: int, sample_weight=None, **extra):
        from topkbench.api import fit
        from topkbench.feature_map import FeatureMap, append_bias
        from topkbench.validation import check_positive

        spec = self._spec()
        rbf = self.kernel == "rbf"
        bias = check_positive("bias", self.bias, allow_zero=True)
        if bias and rbf:
            raise ConfigError("bias applies to kernel='linear' (an RBF kernel ignores a constant)")
        weights = None if sample_weight is None else np.asarray(sample_weight, np.float64)
        class_weight = getattr(self, "class_weight", None)
        # a dual is feasible only for the labels and weights it was computed with
        signature = (spec.name, self.k, self.gamma, self.kernel, self.theta, repr(class_weight),
                     repr(getattr(self, "weights", None)), bias,
                     _fingerprint(X, targets, weights))  # fmt: skip
        warm = None
        if self.warm_start and getattr(self, "_warm_signature", None) == signature:
            warm = self.model_
        self.model_ = fit(
            append_bias(X, bias), targets, spec.name, kernel="rbf" if rbf else None,
            theta=self.theta if rbf else None, C=self.C, k=self.k, gamma=self.gamma,
            eps=self.eps, max_epochs=self.max_epochs, time_limit=self.time_limit,
            seed=self.seed, n_classes=n_classes, warm_start=warm, sample_weight=weights,
            **extra,
        )  # fmt: skip
        self._warm_signature = signature
        if bias:  # the model takes X itself and appends the constant feature
            self.model_.feature_map = FeatureMap(X.shape[1], bias=bias)
        self.model_.classes = self.classes_
        self.model_.info["training_data"] = {"arrays_blake2b": signature[-1]}
        self.n_iter_ = self.model_.epochs
        self.dual_gap_ = self.model_.relative_gap
        self.status_ = self.model_.status
        return self

    @property
    def coef_(self) -> NDArray[np.float64]:
        """The weights, n_classes x n_features (scikit-learn's orientation, also for two
        classes); linear models only."""
        check_is_fitted(self, "model_")
        if self.model_.W is None:
            raise AttributeError("coef_ exists only for kernel='linear'")
        return self.model_.W[: self.n_features_in_].T

    @property
    def intercept_(self) -> NDArray[np.float64]:
        """``bias`` times the constant feature's weights (zeros without ``bias``): the class
        scores are ``X @ coef_.T + intercept_`` (for two classes ``decision_function`` is
        their difference)."""
        W = self.coef_.T  # checks fitted and linear
        if self.model_.W.shape[0] == W.shape[0]:
            return np.zeros(W.shape[1])
        return self.bias * self.model_.W[-1]

    def _scores(self, X) -> NDArray[np.float64]:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, accept_sparse="csr", dtype=(np.float64, np.float32),
                          reset=False)  # fmt: skip
        return self.model_.decision_function(X)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.non_deterministic = False
        return tags


class TopKClassifier(ClassifierMixin, _TopkbenchEstimator):
    """A linear or RBF-kernel classifier trained with one of the multiclass losses of TPAMI
    002 Table 1 or Kato's weighted top-k hinge (``topkbench methods`` lists them).

    Parameters
    ----------
    method : registry name or alias, e.g. ``svm_multi``, ``lr_multi``,
        ``topk_svm_alpha_pseudo``, ``topk_ent``, ``topk_ent_tr``, ``wtopk_svm``.
    C : ``1/(lambda n) > 0``.
    k : the k of a top-k loss, in [1, n_classes - 1]; 1 for the other methods.
    gamma : smoothing (>= 0) of the methods that take it.
    kernel, theta : ``"linear"``, or ``"rbf"`` with ``K = exp(-theta |x - z|^2)``.
    bias : value of a constant feature appended to X (0: none, the papers' default, DESIGN
        §2); its weights, regularized like the others, give ``intercept_``.
    weights : ``wtopk_svm`` only: ``flat``, ``linear``, ``exp`` or a non-increasing sequence.
    eps : relative duality gap at which the solver stops (the certificate).
    max_epochs, time_limit : budgets; stopping on one warns (``ConvergenceWarning``).
    seed : drives the solver's permutations.
    warm_start : start from the previous fit's dual (rescaled to the new C) when refitting on
        the same data with only C (or the budgets) changed; otherwise fit from zero.
    class_weight : ``None``, ``"balanced"`` (``n / (n_classes n_c)``) or a dict class ->
        weight, multiplying each example's loss with its class's weight (SDCA methods).

    Attributes
    ----------
    classes_, coef_ (n_classes x n_features, linear only), intercept_, n_features_in_,
    n_iter_ (epochs),
    dual_gap_ (relative duality gap), status_ (``converged`` or the budget that stopped it),
    model_ (the :class:`topkbench.Model`).
    """

    _task = "multiclass"

    def __init__(self, method: str = "svm_multi", C: float = 1.0, k: int = 1,
                 gamma: float = 0.0, kernel: str = "linear", theta: float | None = None,
                 bias: float = 0.0,
                 weights: Any = "flat", eps: float = 1e-3, max_epochs: int = 1000,
                 time_limit: float | None = None, seed: int = 0,
                 warm_start: bool = False, class_weight: Any = None) -> None:  # fmt: skip
        self.method = method
        self.C = C
        self.k = k
        self.gamma = gamma
        self.kernel = kernel
        self.theta = theta
        self.bias = bias
        self.weights = weights
        self.eps = eps
        self.max_epochs = max_epochs
        self.time_limit = time_limit
        self.seed = seed
        self.warm_start = warm_start
        self.class_weight = class_weight

    def fit(self, X, y, sample_weight=None) -> TopKClassifier:
        """Train on features ``X`` (n x d, dense or sparse) and labels ``y`` of any type;
        ``sample_weight`` (n non-negative numbers) weights each example's loss."""
        spec = self._spec()
        X, y = validate_data(self, X, y, accept_sparse="csr", dtype=(np.float64, np.float32))
        check_classification_targets(y)
        self.classes_, codes = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 classes in y; got 1 class "
                f"({self.classes_[0]!r})"
            )
        extra = {"weights": self.weights} if "weights" in spec.params else {}
        if "weights" not in spec.params and not (isinstance(self.weights, str)
                                                 and self.weights == "flat"):  # fmt: skip
            raise ConfigError(f"weights= is an option of wtopk_svm, not of {spec.name}")
        class_weight = self.class_weight
        if isinstance(class_weight, dict):  # labels -> the class indices fit sees
            index = {c: j for j, c in enumerate(self.classes_.tolist())}
            unknown = [c for c in class_weight if c not in index]
            if unknown:
                raise ConfigError(
                    f"class_weight names {unknown[0]!r}, not a class of y "
                    f"(classes: {', '.join(map(str, self.classes_[:10]))})"
                )
            class_weight = {index[c]: v for c, v in class_weight.items()}
        if class_weight is not None:
            extra["class_weight"] = class_weight
        return self._fit(X, codes, len(self.classes_), sample_weight=sample_weight, **extra)

    def decision_function(self, X) -> NDArray[np.float64]:
        """Scores f(x), n x n_classes; for two classes, f_1 - f_0 (scikit-learn's binary
        convention: positive means ``classes_[1]``)."""
        f = self._scores(X)
        return f[:, 1] - f[:, 0] if f.shape[1] == 2 else f

    def predict(self, X) -> NDArray:
        """The top-scoring class of each row."""
        f = self._scores(X)
        return self.classes_[np.argmax(f, axis=1)]

    def _proper(self) -> bool:
        # the fitted model's loss decides (set_params after fit does not change it)
        fitted = getattr(self, "model_", None)
        name = fitted.method if fitted is not None else get_method(self.method).name
        k = fitted.params["k"] if fitted is not None else self.k
        return name in ("lr_multi", "lr_ova") or (name == "topk_ent" and k == 1)

    @available_if(_proper)
    def predict_proba(self, X) -> NDArray[np.float64]:
        """Class probabilities: softmax(f) (``lr_multi``, ``topk_ent`` at k = 1) or the
        normalized sigmoids of OVA logistic regression (``lr_ova``)."""
        f = self._scores(X)
        if self.model_.method == "lr_ova":
            p = 0.5 * (1.0 + np.tanh(0.5 * f))  # sigmoid without overflow
        else:
            p = np.exp(f - f.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    @available_if(_proper)
    def predict_log_proba(self, X) -> NDArray[np.float64]:
        return np.log(self.predict_proba(X))


class MultilabelClassifier(ClassifierMixin, _TopkbenchEstimator):
    """A linear or RBF-kernel multilabel classifier trained with SVM^ML or LR^ML (TPAMI 002
    §3.3): a label is predicted where its score reaches ``threshold``.

    Parameters
    ----------
    method : ``svm_ml`` (multilabel hinge; smooth for ``gamma > 0``) or ``lr_ml``.
    C, gamma, kernel, theta, bias, eps, max_epochs, time_limit, seed, warm_start : as in
        :class:`TopKClassifier`.
    threshold : a number delta (predict label j iff f_j(x) >= delta), or ``"cv"``: delta is
        chosen on the training data by ``cv``-fold cross-validation (the out-of-fold scores of
        every fold, pooled) on the ``delta_grid`` grid of the paper's protocol, for
        ``threshold_metric``, and the model is then refit on all of the data.
    threshold_metric : a partition metric (``f1_macro``, ``f1_micro``, ``f1_inst``, ``acc``,
        ``sacc``, ``hloss``; :mod:`topkbench.metrics.multilabel`, 0/0 counted as 0).
    delta_grid : ``mulan`` (71 values, TPAMI Tables 7/9) or ``voc`` (Tables 10-12).
    cv : the threshold selection's folds: a number (>= 2; shuffled by ``seed``), a
        scikit-learn splitter or a list of (train, test) index pairs.

    ``fit(X, Y)`` takes an n x m 0/1 indicator (dense or sparse) or a list of label sets (read
    as ``sklearn.preprocessing.MultiLabelBinarizer`` does).  Examples whose label set is empty
    or complete carry no ranking constraint and are left out of training (TPAMI §3.3).

    Attributes
    ----------
    classes_ (the label of each column), threshold_ (the delta used), coef_, intercept_,
    n_features_in_,
    n_iter_, dual_gap_, status_, model_.
    """

    _task = "multilabel"

    def __init__(self, method: str = "svm_ml", C: float = 1.0, gamma: float = 0.0,
                 kernel: str = "linear", theta: float | None = None, bias: float = 0.0,
                 threshold: Any = 0.0,
                 threshold_metric: str = "f1_macro", delta_grid: str = "mulan", cv: int = 5,
                 eps: float = 1e-3, max_epochs: int = 1000, time_limit: float | None = None,
                 seed: int = 0, warm_start: bool = False) -> None:  # fmt: skip
        self.method = method
        self.C = C
        self.gamma = gamma
        self.kernel = kernel
        self.theta = theta
        self.bias = bias
        self.threshold = threshold
        self.threshold_metric = threshold_metric
        self.delta_grid = delta_grid
        self.cv = cv
        self.eps = eps
        self.max_epochs = max_epochs
        self.time_limit = time_limit
        self.seed = seed
        self.warm_start = warm_start

    @property
    def k(self) -> int:  # the multilabel losses have no k
        return 1

    def _indicator(self, Y, n: int, classes=None):
        """(labels of the columns, CSR indicator) of ``Y``; with ``classes``, label sets are
        encoded on those columns (labels outside them are refused)."""
        if Y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None"
            )
        if sp.issparse(Y):
            return np.arange(Y.shape[1]), sp.csr_matrix(Y)
        try:  # a rectangular numeric array is an indicator (scikit-learn's convention)
            arr = np.asarray(Y)
        except ValueError:  # ragged: label sets
            arr = None
        if arr is not None and arr.ndim == 2 and arr.shape[1] > 1 and arr.dtype.kind in "biuf":
            if not np.isin(arr, (0, 1)).all():
                raise ValueError(
                    "a rectangular numeric y is read as an n x m 0/1 indicator, and this one "
                    "holds other values; pass label sets as a list of sets, e.g. [{0, 1}, {2}]"
                )
            return np.arange(arr.shape[1]), sp.csr_matrix(arr)
        collections = (list, tuple, set, frozenset, np.ndarray)
        if (arr is not None and (arr.ndim == 1 or (arr.ndim == 2 and arr.shape[1] == 1))
                and not any(isinstance(v, collections) for v in arr.ravel())):  # fmt: skip
            # one label per example (a one-column indicator could never be trained: every
            # label set would be empty or complete): singleton label sets, as topkbench.fit
            # reads 1-D class indices
            arr = arr.ravel()
            if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                raise ValueError("Y contains NaN or infinity")
            check_classification_targets(arr)
            Y = [[lab] for lab in arr.tolist()]
        from sklearn.preprocessing import MultiLabelBinarizer

        try:
            sets = [list(s) for s in Y]
        except TypeError:
            raise ValueError(
                "Y must be an n x m 0/1 indicator or a list of label sets (one iterable of "
                "labels per example)"
            ) from None
        if len(sets) != n:
            raise ConfigError(f"Y has {len(sets)} label sets for {n} rows of X")
        mlb = MultiLabelBinarizer(classes=classes, sparse_output=True).fit(sets)
        if classes is not None:
            unknown = {lab for s in sets for lab in s} - set(classes.tolist())
            if unknown:
                raise ConfigError(f"labels not seen in training: {sorted(unknown, key=str)[:5]}")
        return mlb.classes_, mlb.transform(sets).tocsr()

    def fit(self, X, y, sample_weight=None) -> MultilabelClassifier:
        """Train on features ``X`` (n x d) and label sets ``y`` (indicator or list of sets);
        ``sample_weight`` (n non-negative numbers) weights each example's loss."""
        from topkbench.metrics.multilabel import PARTITION_METRICS, delta_grid
        from topkbench.validation import check_choice

        self._spec()
        X = validate_data(self, X, accept_sparse="csr", dtype=(np.float64, np.float32))
        classes, T = self._indicator(y, X.shape[0])
        if T.shape[0] != X.shape[0]:
            raise ConfigError(f"Y has {T.shape[0]} rows for {X.shape[0]} rows of X")
        if T.shape[1] < 2:
            raise ValueError(
                f"{type(self).__name__} needs at least 2 label columns; got 1 class (a ranking "
                "loss has nothing to rank)"
            )
        select = isinstance(self.threshold, str)
        if select:
            check_choice("threshold", self.threshold, ("cv",))
            metric = check_choice("threshold_metric", self.threshold_metric, PARTITION_METRICS)
            grid = delta_grid(self.delta_grid)
            folds = self.cv
        elif isinstance(self.threshold, bool) or not np.isfinite(self.threshold):
            raise ConfigError(f"threshold must be a finite number or 'cv'; got {self.threshold!r}")
        self.classes_ = np.asarray(classes)
        if select:
            self.threshold_ = self._cv_threshold(X, T, metric, grid, folds, sample_weight)
        else:
            self.threshold_ = float(self.threshold)
        return self._fit(X, T, T.shape[1], sample_weight=sample_weight)

    def _cv_threshold(self, X, T, metric: str, grid, folds, sample_weight=None) -> float:
        """delta maximizing ``metric`` (minimizing, for ``hloss``) on the pooled out-of-fold
        scores of fits with this estimator's parameters; ``folds`` is a number of shuffled
        folds (drawn with ``seed``), a scikit-learn splitter or a list of (train, test)."""
        from sklearn.base import clone
        from sklearn.model_selection import KFold, check_cv

        from topkbench.metrics.multilabel import select_thresholds
        from topkbench.validation import check_int

        if isinstance(folds, (int, np.integer)) and not isinstance(folds, bool):
            folds = check_int("cv", folds, 2)
            if X.shape[0] < folds:
                raise ConfigError(f"threshold='cv' with cv={folds} needs at least {folds} examples")
            splitter = KFold(folds, shuffle=True, random_state=self.seed)
        else:
            splitter = check_cv(folds)
        S = np.full(T.shape, np.nan)
        inner = clone(self).set_params(threshold=0.0, warm_start=False)
        for train, test in splitter.split(X):
            sw = None if sample_weight is None else np.asarray(sample_weight)[train]
            inner.fit(X[train], T[train], sample_weight=sw)
            S[test] = inner.decision_function(X[test])
        scored = ~np.isnan(S).any(axis=1)  # rows of some test fold
        return select_thresholds(S[scored], T[scored], grid)[metric][0]

    def decision_function(self, X) -> NDArray[np.float64]:
        """Scores f(x), n x n_labels."""
        return self._scores(X)

    def predict(self, X) -> NDArray[np.int64]:
        """The 0/1 indicator of f_j(x) >= threshold_, n x n_labels (columns: ``classes_``)."""
        return (self._scores(X) >= self.threshold_).astype(np.int64)

    def score(self, X, y, sample_weight=None) -> float:
        """Subset accuracy (the whole label set right), scikit-learn's multilabel score."""
        from sklearn.metrics import accuracy_score

        pred = self.predict(X)
        _, T = self._indicator(y, pred.shape[0], self.classes_)
        return float(accuracy_score(T.toarray(), pred, sample_weight=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        return tags


def top_k_scorer(k: int):
    """A scorer for ``GridSearchCV(scoring=...)``: top-k accuracy of the estimator's decision
    function (``sklearn.metrics.top_k_accuracy_score``, with the labels of ``classes_``, so
    that a fold missing some class scores correctly)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"k must be an integer >= 1; got {k!r}")

    def scorer(estimator, X, y) -> float:
        return float(top_k_accuracy_score(y, estimator.decision_function(X), k=int(k),
                                          labels=estimator.classes_))  # fmt: skip

    scorer.__name__ = f"top_{int(k)}_accuracy"
    return scorer
