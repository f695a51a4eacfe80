# SPDX-License-Identifier: MIT
"""Context: KV cache, batch state and request queue of one job (flexdiag_context).

Owns: context params from keyword arguments (policy and batching by name), the progress
callback (a Python callable behind a module-level C trampoline: an exception it raises is kept,
cancels the context's requests by returning false, and is raised again in the caller's thread),
generation of images and text (a submit on the context's queue and its result), teacher-forced
scoring, cancel, and the context's counters. Calls on one context may come from several
threads, as the header allows; close() cancels what runs and waits for the calls in flight.
"""
import array
import collections
import ctypes as C

from . import _images as I
from . import _queue as Q
from . import _structs as S
from ._lib import INIT_SCRATCH, check, init, lib
from ._native import Native, in_callback, lookup, register, running_callback, unregister

BATCHING = {"continuous": 0, "blocks": 1}
PHASE_PREFILL, PHASE_DECODE = 0, 1

Scores = collections.namedtuple("Scores", "logits raw")
Scores.__doc__ = """Teacher-forced logits: logits (n, vocab), CFG-combined for Janus; raw
(rows, n, vocab) per row (conditional, unconditional) or None when not asked for. numpy
float32 arrays, or lists of array('f') rows without numpy."""


def policy_kind(policy):
    """flexdiag_policy_kind of a policy name ("dense", "diagonal", ...) or kind number."""
    if isinstance(policy, int):
        return policy
    kind = C.c_int()
    check(lib().flexdiag_policy_from_name(policy.encode(), C.byref(kind)))
    return kind.value


def context_params(params):
    """flexdiag_context_params from keyword arguments: its field names, with policy (a name or
    kind), n_att, n_r and sparsity for its policy and batching "continuous" or "blocks"."""
    params = dict(params)
    p = init(S.ContextParams())
    policy = params.pop("policy", None)
    if policy is not None:
        p.policy.kind = policy_kind(policy)
    S.fill(p.policy, {k: params.pop(k, None) for k in ("n_att", "n_r", "sparsity")}, "policy")
    batching = params.pop("batching", None)
    if batching is not None:
        if batching not in BATCHING and batching not in BATCHING.values():
            raise ValueError(f"batching {batching!r}: use 'continuous' or 'blocks'")
        p.batching = BATCHING.get(batching, batching)
    return S.fill(p, params, "Context", reserved=("policy", "progress", "progress_user"))


class _Progress:
    """The progress callable of a context and what it raised."""

    def __init__(self, fn):
        self.fn = fn
        self.error = None


@S.PROGRESS_FN
def _on_progress(phase, done, total, user):
    st = lookup(user)
    if st is None:
        return True
    if st.error is not None:
        return False
    with in_callback():
        try:
            return st.fn(phase, done, total) is not False
        except BaseException as e:  # nothing may unwind into C
            st.error = e
            return False


def _floats(buf, rows, n, vocab):
    """A score buffer as numpy (rows, n, vocab) / (n, vocab) or nested lists of array('f')."""
    np = I.numpy()
    if np is not None:
        a = np.frombuffer(buf, dtype=np.float32).copy()
        return a.reshape((rows, n, vocab) if rows else (n, vocab))
    flat = array.array("f", bytes(buf))
    row = [flat[i * vocab:(i + 1) * vocab] for i in range(max(rows, 1) * n)]
    return [row[r * n:(r + 1) * n] for r in range(rows)] if rows else row


class Context(Native):
    """One job's KV cache, batch and request queue on a model (flexdiag_context).

    progress: optional callable(phase, done, total), phase 0 = prefill (per layer), 1 = decode
    (per step); it runs on the context's engine thread, and returning False cancels every
    request of the context. The other keyword arguments are the fields of
    flexdiag_context_params (max_images, micro_batch, max_prompt_len, max_new_tokens, text,
    kv_pct, cpu_attention, images_per_prompt, cpu_attention_pct, queue_images, draft_len,
    sjd_group, policy_calib, ssd_tau), plus policy ("dense", "diagonal", ...), n_att, n_r, sparsity and batching
    ("continuous", "blocks")."""

    def __init__(self, model, progress=None, **params):
        super().__init__(model)
        self.model = model
        p = context_params(params)
        self._progress = _Progress(progress)
        self._key = None
        if progress is not None:
            if not callable(progress):
                raise TypeError("progress must be a callable(phase, done, total)")
            self._key = register(self._progress)
            p.progress, p.progress_user = _on_progress, self._key
        ptr = C.c_void_p()
        try:
            with model._call() as m:
                check(lib().flexdiag_context_create(m, C.byref(p), C.byref(ptr)))
        except BaseException:
            unregister(self._key)
            raise
        self._ptr = ptr.value
        model._contexts.add(self)

    def _interrupt(self, ptr):
        lib().flexdiag_context_cancel(ptr)

    def _destroy(self, ptr):
        lib().flexdiag_context_destroy(ptr)
        unregister(self._key)

    def close(self):
        """Cancel its requests, wait for the calls in flight, free it. Not from its callbacks
        (the engine thread would wait for itself)."""
        if running_callback():
            raise RuntimeError("Context.close() from a callback would wait for that callback: "
                               "cancel there (return False, cancel()) and close after the "
                               "call returns")
        super().close()

    def take_callback_error(self):
        """What the progress callback raised (then cleared), or None."""
        err, self._progress.error = self._progress.error, None
        return err

    # ---- requests ----

    def submit(self, prompts, *, images_per_prompt=None, cfg_weight=None, temperature=None,
               top_k=None, top_p=None, seed=None, first_image=None, draft_len=None,
               sjd_group=None, on_image=None, on_token=None, on_done=None, wait_for_room=True):
        """Queue images for prompts (a text, a list of texts, or a list of prompt id lists);
        returns a Handle at once. Sampling arguments left None take the library's defaults
        (flexdiag_request_init: cfg_weight 5, temperature 1, top_k 0, top_p 1, seed 0).
        Callbacks run on the engine thread: on_image(handle, index, tokens) per finished
        image (tokens: a flat list), on_token(handle, index, step, id) per token,
        on_done(handle, status) at the end; an exception in one cancels the request, the
        request's later callbacks are skipped and result() raises it. wait_for_room False:
        Error BUSY when the queue is full. draft_len: the speculative Jacobi decoding window
        of these images (None: the context's draft_len, 1: sequential). sjd_group: their
        grouped acceptance (lossy; None: the context's sjd_group, -1: exact SJD)."""
        req = Q.CRequest(prompts, images_per_prompt=images_per_prompt, cfg_weight=cfg_weight,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                         first_image=first_image, draft_len=draft_len, sjd_group=sjd_group)
        return self._submit("image", req, on_image, on_token, on_done, wait_for_room)

    def submit_text(self, prompts, *, max_new_tokens=None, stop_at_eos=True,
                    images_per_prompt=None, temperature=None, top_k=None, top_p=None, seed=None,
                    first_image=None, on_image=None, on_token=None, on_done=None,
                    wait_for_room=True):
        """Queue text continuations of prompts (texts need the model's tokenizer.json; else
        give id lists); max_new_tokens None: the context's; stop_at_eos: a sequence ends after
        the model's end id; images_per_prompt: continuations per prompt. Callbacks as
        submit(), on_image per finished sequence."""
        req = Q.CRequest(prompts, images_per_prompt=images_per_prompt, temperature=temperature,
                         top_k=top_k, top_p=top_p, seed=seed, first_image=first_image)
        return self._submit("text", req, on_image, on_token, on_done, wait_for_room,
                            max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)

    def _submit(self, kind, req, on_image, on_token, on_done, wait_for_room, **text):
        h = Q.Handle(self, kind, on_image, on_token, on_done)
        with self._call() as c:
            h._start(c, req, wait_for_room, **text)
        return h

    def generate(self, prompts, *, image_format="auto", **sampling):
        """Generate and wait: a list of ImageResult (index, tokens grid, image) in request
        order. image_format: "auto" (PIL if importable, else numpy, else RawImage), "pil",
        "numpy", "raw", or None for tokens only. Sampling arguments as submit()."""
        with self.submit(prompts, **sampling) as h:
            return h.result(image_format)

    def generate_text(self, prompts, **sampling):
        """Generate text and wait: a list of TextResult (index, ids, text). Arguments as
        submit_text()."""
        with self.submit_text(prompts, **sampling) as h:
            return h.result()

    def images(self, handles, image_format="auto"):
        """Iterate over the results of handles (a Handle or several) as their images finish;
        a cancelled request's finished images come, the others do not."""
        return Q.finished(handles, image_format)

    # ---- scoring, cancel, counters ----

    def score(self, prompt_ids, ids, cfg_weight=None, raw=False):
        """Teacher-forced logits of ids after prompt_ids (Janus: BOS .. <begin_of_image>):
        Scores(logits, raw); raw per-row logits only when raw is True."""
        rq = init(S.ScoreRequest())
        pa = (C.c_int32 * len(prompt_ids))(*prompt_ids)
        ia = (C.c_int32 * len(ids))(*ids)
        rq.prompt_ids, rq.prompt_len, rq.ids, rq.n = pa, len(pa), ia, len(ia)
        S.fill(rq, {"cfg_weight": cfg_weight}, "score")
        so = S.ScoreOutput(struct_size=C.sizeof(S.ScoreOutput))
        with self._call() as c:
            check(lib().flexdiag_score(c, C.byref(rq), C.byref(so)))  # sizes
            logits = (C.c_float * (len(ia) * so.vocab))()
            rows = (C.c_float * (so.rows * len(ia) * so.vocab))() if raw else None
            so.logits = logits
            if raw:
                so.raw = rows
            check(lib().flexdiag_score(c, C.byref(rq), C.byref(so)))
        err = self.take_callback_error()
        if err is not None:
            raise err
        return Scores(_floats(logits, 0, len(ia), so.vocab),
                      _floats(rows, so.rows, len(ia), so.vocab) if raw else None)

    def cancel(self):
        """Cancel every request submitted so far and the scoring call in flight (any
        thread)."""
        with self._call() as c:
            check(lib().flexdiag_context_cancel(c))

    def stats(self):
        """Counters of the last run (flexdiag_stats) as a dict."""
        scratch = C.create_string_buffer(INIT_SCRATCH)  # a newer library's flexdiag_stats
        with self._call() as c:
            check(lib().flexdiag_context_stats(c, scratch))
        return S.as_dict(S.Stats.from_buffer_copy(scratch))

    def policy(self):
        """The resolved KV policy of its runs as a dict (name, n_att, n_r, l_dec, sparsity)."""
        p = S.PolicyInfo(struct_size=C.sizeof(S.PolicyInfo))
        with self._call() as c:
            check(lib().flexdiag_context_policy(c, C.byref(p)))
        d = S.as_dict(p)
        d["name"] = (lib().flexdiag_policy_name(p.kind) or b"").decode()
        return d

    def offload(self):
        """Where its weights and KV live and what moved (flexdiag_offload_info) as a dict."""
        o = S.OffloadInfo(struct_size=C.sizeof(S.OffloadInfo))
        with self._call() as c:
            check(lib().flexdiag_context_offload(c, C.byref(o)))
        return S.as_dict(o)
