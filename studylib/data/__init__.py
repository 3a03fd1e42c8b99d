"""L1, the data pipeline (needs only ``config`` and ``storage``): corpus -> split by story -> SentencePiece BPE (training stories) -> token file
-> windows per side.

In the spirit of llama2.c's ``tinystories.py``; :func:`studylib.data.pipeline.load_data` runs one
function per stage, one module per stage:

1. **Stories** (:mod:`.stories`, :func:`.split.read_corpus`) come from local files (``data.data_dir``) or the Hugging Face
   hub (``data.hub_dataset``); ``data.max_stories`` keeps only the first N. One pass reads every
   story (a bad file fails here, before anything is written) and fingerprints the corpus (sha256
   of the story texts, in order).
2. **Split by story** (:func:`.split.split_stories`): the story numbers ``0..n-1`` are permuted with
   ``np.random.default_rng(split_seed)``; the first ``round(n * val_fraction)`` (at least 1, at
   most n-1) are the validation stories, the rest the training stories. Each side keeps the
   corpus order (training order per epoch comes from :func:`.windows.epoch_order`). A story lies wholly
   on one side, so no validation text is ever trained on, nor seen by the tokenizer. (Splitting
   windows instead, as before ``DATA_SPLIT`` ``story/v1``, put part of nearly every validation
   story into training: at context 128 a story spans ~2 windows.)
3. **Tokenizer** (:func:`.tokenizer.tokenizer_for`): a SentencePiece BPE model (byte fallback, unk=0, bos=1,
   eos=2, no pad) trained on the **training stories only**, cached as
   ``<cache_dir>/tokenizer-<key>.model``; the key hashes the corpus fingerprint, the split
   (``DATA_SPLIT``, ``split_seed``, ``val_fraction``), the vocab size and the trainer options.
4. **Token file** (:func:`.tokens.token_file`): every story is encoded once as ``story <eos>`` (no
   ``<bos>``: the eos that ends one story is the separator before the next) into one flat
   ``uint16`` array (``uint32`` when the vocab exceeds 65,535) holding the training stories'
   tokens, then the validation stories' tokens: ``<cache_dir>/tokens-<key>.bin`` + a sidecar
   ``tokens-<key>.json`` with the token and story counts per side and the sha256. Both files are
   written atomically; a cache whose size or sha256 is wrong is reported and rebuilt, never used.
   The array is loaded with ``np.memmap``. SentencePiece's default normalisation turns newlines
   inside a story into spaces.
5. **Windows per side** (:func:`.windows.split_windows`): each side is cut on its own into fixed,
   non-overlapping windows of ``context`` tokens starting at the side's first token (each side's
   trailing partial window is dropped), so no window crosses from training text into validation
   text. Windows are numbered training first: window ``i < T`` is ``tokens[i*context:(i+1)*context]``,
   window ``T + j`` is the j-th window of the validation region (:meth:`.windows.TokenData.window_starts`).
   Each window gives ``context - 1`` next-token targets.
   The training batch stream and the evaluation subset over those windows are
   :class:`.windows.BatchSampler` and :func:`.windows.eval_subset`.

Cache keys, the rebuild warning and the progress lines are :mod:`.cache`.
"""
