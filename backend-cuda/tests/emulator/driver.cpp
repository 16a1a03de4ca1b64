// Runs Specula kernels on the host emulator (shim.hpp). Prepended by the test with the defines,
// the emulator, common.cuh, select.cuh and the kernel files. Inputs are DIR/<name>.bin, outputs
// DIR/<name>.out; OFFSET is the window offset, in elements, of the probability or logit rows.
//
//   driver sample     DIR ROWS VOCAB OFFSET SPLITS STRIDE [LOGITS [FALLBACK [AGAIN]]]
//                     (probs top_k top_p seed [temperature] [fallback] -> tokens; with AGAIN 1,
//                     split rows run twice on the same scratch and barrier words -> tokens_again)
//
// Scratch (split rows, REJECTION's stats, ngram's proposals, logprobs' entries) starts full of
// garbage, as the device's reused arena may be: every kernel must write what it reads.
//   driver candidates DIR ROWS VOCAB OFFSET C [LOGITS [FALLBACK]]
//                     (probs top_p batch_id [temperature] [fallback] -> ids scores lens)
//   driver argmax     DIR ROWS VOCAB OFFSET                 (probs -> tokens)
//   driver softmax    DIR ROWS VOCAB OFFSET                 (probs temperature -> probs)
//   driver verify     DIR ROWS VOCAB OFFSET MAX_BSZ REAL_BSZ S STRATEGY ACCEPT_ALL REJECT_ALL C N_END
//                     [LOGITS [FALLBACK [DRAFT_ROWS]]]   (REJECTION with LOGITS 1 reads temperature:
//                     the rows are logits; with FALLBACK 1 it reads fallback; with DRAFT_ROWS > 0
//                     the draft rows are that many compact rows and it reads draft_index)
//   driver logprobs   DIR ROWS VOCAB OFFSET MAX_BSZ REAL_BSZ S K
//   driver batch      DIR MAX_BSZ REAL_BSZ S CAPACITY ROW_BYTES TOKEN_NUM MAX_MODEL_LEN THRESHOLD
//                     MIN_N MAX_N N_END   (layout, sampling params, gather, update_state, ngram)
//   driver counts     DIR <the batch arguments> VOCAB   (update_state with token_counts)
//   driver process    DIR ROWS VOCAB MAX_BSZ REAL_BSZ S MAX_MODEL_LEN N_END N_BIAS N_BAD LOGITS
//                     ALLOWED BITMASK [FIRST BLOCK_ROWS [SLICE_FIRST SLICE_LEN]]   (process_logits
//                     -> processed fallback; with FIRST BLOCK_ROWS only that block of the ROWS rows,
//                     into BLOCK_ROWS rows; with SLICE_FIRST SLICE_LEN the scores are [ROWS,
//                     SLICE_LEN], the ids SLICE_FIRST .. of the VOCAB of the tables)
//   the sharded ops, over ROWS rows of the slice [FIRST, FIRST + LEN) (scores [temperature]
//   row_key [min_p]: temperature with LOGITS 1, min_p with MIN_P 1):
//   driver shard_key       DIR ROWS LEN FIRST ORDER LOGITS IDS   (scores [ids] -> keys)
//   driver shard_records   DIR ROWS LEN FIRST K ORDER LOGITS MIN_P   (-> records)
//   driver shard_histogram DIR ROWS LEN FIRST SHIFT LOGITS MIN_P   (+ prefix floor -> counts masses)
//   driver shard_walk      DIR ROWS LEN FIRST LOGITS MIN_P DRAFT_ROWS   (+ threshold offset, with
//                          DRAFT_ROWS > 0 draft draft_key draft_row target_mass draft_mass
//                          -> tokens mass count)
//   driver shard_exp_sum   DIR ROWS LEN FIRST   (scores temperature row_key -> sums)

#include <string>

typedef SPECULA_T::raw raw;
typedef SPECULA_D::raw draft_raw;

static std::vector<unsigned char> read_file(const std::string& path) {
    FILE* f = fopen(path.c_str(), "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path.c_str()); exit(2); }
    std::vector<unsigned char> data;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
    fclose(f);
    return data;
}

static void write_file(const std::string& path, const void* p, size_t bytes) {
    FILE* f = fopen(path.c_str(), "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path.c_str()); exit(2); }
    fwrite(p, 1, bytes, f);
    fclose(f);
}

// One run: its directory and its numeric arguments (argv[3] on).
struct Run {
    std::string dir;
    int argc;
    char** argv;

    u64 arg(int i) const {
        if (i >= argc) { fprintf(stderr, "argument %d missing\n", i); exit(2); }
        return (u64)atoll(argv[i]);
    }

    // An optional trailing argument (0 when absent).
    u64 opt_arg(int i) const { return i < argc ? (u64)atoll(argv[i]) : 0; }

    // Input `name` in device memory, `offset` elements into its allocation.
    template <class T> T* in(const char* name, size_t offset = 0) const {
        const std::vector<unsigned char> data = read_file(dir + name + ".bin");
        T* p = dalloc<T>(data.size() / sizeof(T) + offset + 1) + offset;
        memcpy(p, data.data(), data.size());
        return p;
    }

    // Input `name` when `present`, else no buffer.
    template <class T> T* in_if(bool present, const char* name) const {
        return present ? in<T>(name) : nullptr;
    }

    // Output `name`: the `n` elements at `p`.
    template <class T> void out(const char* name, const T* p, u64 n) const {
        write_file(dir + name + ".out", p, sizeof(T) * n);
    }

    // The rows of the row kinds: ROWS VOCAB OFFSET.
    u32 rows() const { return (u32)arg(3); }
    u32 vocab() const { return (u32)arg(4); }
    size_t offset() const { return (size_t)arg(5); }
};

static u32 vec_ok(const void* p, size_t elem, u32 vocab) {
    return ((uintptr_t)p % (4 * elem) == 0 && vocab % 4 == 0) ? 1u : 0u;
}

static u32 blocks_for(u64 n, u32 block) { return (u32)((n + block - 1) / block); }

// Scratch of `n` bytes full of garbage (a reused arena holds what the last op left there).
static unsigned char* dalloc_scratch(u64 n) {
    unsigned char* p = dalloc<unsigned char>(n);
    u64 x = 0x9e3779b97f4a7c15ull;
    for (u64 i = 0; i < n; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (unsigned char)(x >> 56);
    }
    return p;
}

// An output of `n` elements in device memory, each `garbage` (the kernel must write every one).
template <class T> static T* dalloc_filled(u64 n, T garbage) {
    T* p = dalloc<T>(n);
    for (u64 i = 0; i < n; ++i) p[i] = garbage;
    return p;
}

// The scores of a sampling kernel's `a`: logits rows (LOGITS, argument `i`: reads temperature) or
// probabilities, with a fallback per row or not (FALLBACK, argument `i + 1`: reads fallback).
template <class Args> static void read_scores_kind(const Run& run, Args& a, int i) {
    a.logits = (u32)run.opt_arg(i);
    a.temperature = run.in_if<float>(a.logits != 0, "temperature");
    a.fallback = run.in_if<i32>(run.opt_arg(i + 1) != 0, "fallback");
}

static void run_sample(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab(), splits = (u32)run.arg(6);
    const u64 stride = run.arg(7);
    SampleArgs a;
    a.probs = run.in<raw>("probs", run.offset());
    a.top_k = run.in<i32>("top_k");
    a.top_p = run.in<float>("top_p");
    a.seed = run.in<u64>("seed");
    read_scores_kind(run, a, 8);
    a.pad = 0;
    a.tokens = dalloc_filled<i32>(rows, -7);
    a.rows = rows;
    a.vocab = vocab;
    a.vec = vec_ok(a.probs, sizeof(raw), vocab);
    a.splits = splits;
    a.scratch_stride = stride;
    a.scratch = splits > 1 ? dalloc_scratch(stride * rows) : nullptr;
    // The barrier words: zeroed once, as the device allocates them.
    a.sync = splits > 1 ? dalloc<u64>(2 * (u64)rows) : nullptr;
    if (splits > 1) {
        launch(SPECULA_ENTRY(top_k_top_p_sample_split), splits, rows, SEL_BLOCK, a, splits * rows);
        run.out("tokens", a.tokens, rows);
        if (run.opt_arg(10) == 0) return;
        // Again on what the first launch left in the scratch and the barrier words.
        for (u32 r = 0; r < rows; ++r) a.tokens[r] = -7;
        launch(SPECULA_ENTRY(top_k_top_p_sample_split), splits, rows, SEL_BLOCK, a, splits * rows);
        run.out("tokens_again", a.tokens, rows);
    } else {
        launch(SPECULA_ENTRY(top_k_top_p_sample), rows, 1, SEL_BLOCK, a, 2);
        run.out("tokens", a.tokens, rows);
    }
}

static void run_candidates(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab(), c = (u32)run.arg(6);
    CandidatesArgs a;
    a.probs = run.in<raw>("probs", run.offset());
    a.top_p = run.in<float>("top_p");
    a.batch_id = run.in<i32>("batch_id");
    read_scores_kind(run, a, 7);
    a.pad = 0;
    a.ids = dalloc<i32>((u64)rows * c);
    a.scores = dalloc<float>((u64)rows * c);
    a.lens = dalloc<i32>(rows);
    a.rows = rows;
    a.vocab = vocab;
    a.candidates = c;
    a.vec = vec_ok(a.probs, sizeof(raw), vocab);
    launch(SPECULA_ENTRY(top_p_candidates), rows, 1, SEL_BLOCK, a, 2);
    run.out("ids", a.ids, (u64)rows * c);
    run.out("scores", a.scores, (u64)rows * c);
    run.out("lens", a.lens, rows);
}

static void run_argmax(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab();
    ArgmaxArgs a;
    a.input = run.in<raw>("probs", run.offset());
    a.out = dalloc<i32>(rows);
    a.rows = rows;
    a.vocab = vocab;
    a.vec = vec_ok(a.input, sizeof(raw), vocab);
    launch(SPECULA_ENTRY(argmax), rows, 1, SPECULA_ROW_BLOCK, a, 2);
    run.out("tokens", a.out, rows);
}

static void run_softmax(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab();
    SoftmaxArgs a;
    a.logits = run.in<raw>("probs", run.offset());
    a.temperature = run.in<float>("temperature");
    a.probs = dalloc<float>((u64)rows * vocab);
    a.rows = rows;
    a.vocab = vocab;
    a.vec = vec_ok(a.logits, sizeof(raw), vocab);
    a.pad = 0;
    launch(SPECULA_ENTRY(softmax), rows, 1, SPECULA_ROW_BLOCK, a, 2);
    run.out("probs", a.probs, (u64)rows * vocab);
}

static void run_verify(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab();
    VerifyArgs a;
    memset(&a, 0, sizeof a);
    const u32 max_bsz = (u32)run.arg(6), real_bsz = (u32)run.arg(7);
    const u64 s = run.arg(8);
    a.strategy = (u32)run.arg(9);
    a.accept_all = (u32)run.arg(10);
    a.reject_all = (u32)run.arg(11);
    a.candidates = run.arg(12);
    a.n_end = run.arg(13);
    a.rows = rows;
    a.vocab = vocab;
    a.max_bsz = max_bsz;
    a.real_bsz = real_bsz;
    a.max_step_tokens = s;
    a.draft_tokens = run.in<i32>("draft_tokens");
    a.this_time = run.in<i32>("this_time");
    a.encoder = run.in<i32>("encoder");
    a.cu_out = run.in<i32>("cu_out");
    a.stop_flags = run.in<u8>("stop_flags");
    a.is_block_step = run.in<u8>("is_block_step");
    a.reasoning = run.in<i32>("reasoning");
    a.step_idx = run.in<i32>("step_idx");
    a.max_dec_len = run.in<i32>("max_dec_len");
    a.end_tokens = run.in<i32>("end_tokens");
    a.seeds = run.in<u64>("seeds");
    a.accept_tokens = dalloc_filled<i32>(max_bsz * s, -9);
    a.accept_num = dalloc<i32>(max_bsz);
    if (a.strategy == SPECULA_STRATEGY_REJECTION) {
        a.target_probs = run.in<raw>("target_probs", run.offset());
        a.draft_probs = run.in<draft_raw>("draft_probs");
        a.top_k = run.in<i32>("top_k");
        a.top_p = run.in<float>("top_p");
        read_scores_kind(run, a, 14);
        const u64 compact_rows = run.opt_arg(16);
        a.draft_index = run.in_if<i32>(compact_rows != 0, "draft_index");
        a.draft_rows = compact_rows != 0 ? compact_rows : (u64)max_bsz * (s - 1);
        a.vec_target = vec_ok(a.target_probs, sizeof(raw), vocab);
        a.vec_draft = vec_ok(a.draft_probs, sizeof(draft_raw), vocab);
        a.stats = dalloc_scratch(sizeof(TargetStats) * rows + 8 * a.draft_rows + 8);
        if (rows + a.draft_rows > 0)
            launch(SPECULA_ENTRY(verify_draft_tokens_rejection_prepare), (u32)(rows + a.draft_rows), 1, SEL_BLOCK, a, 2);
        launch(SPECULA_ENTRY(verify_draft_tokens_rejection), max_bsz, 1, SEL_BLOCK, a, 2);
    } else {
        a.target_tokens = run.in<i32>("target_tokens");
        a.cand_ids = run.in<i32>("cand_ids");
        a.cand_scores = run.in<float>("cand_scores");
        a.cand_lens = run.in<i32>("cand_lens");
        launch(SPECULA_ENTRY(verify_draft_tokens), blocks_for(max_bsz, SPECULA_BATCH_BLOCK), 1, SPECULA_BATCH_BLOCK, a,
               1);
    }
    run.out("accept_tokens", a.accept_tokens, max_bsz * s);
    run.out("accept_num", a.accept_num, max_bsz);
}

static void run_logprobs(const Run& run) {
    const u32 rows = run.rows(), vocab = run.vocab();
    LogprobsArgs a;
    memset(&a, 0, sizeof a);
    const u32 max_bsz = (u32)run.arg(6), real_bsz = (u32)run.arg(7);
    const u64 s = run.arg(8);
    const u32 k = (u32)run.arg(9);
    const u64 entries = (u64)max_bsz * s;
    a.logits = run.in<raw>("probs", run.offset());
    a.temperature = run.in<float>("temperature");
    a.accept_tokens = run.in<i32>("accept_tokens");
    a.accept_num = run.in<i32>("accept_num");
    a.encoder = run.in<i32>("encoder");
    a.cu_out = run.in<i32>("cu_out");
    a.cu_accept = dalloc<i32>(max_bsz + 1);
    a.token_ids = dalloc<i32>(entries);
    a.logprobs = dalloc<float>(entries);
    a.ranks = dalloc<i32>(entries);
    a.top_ids = dalloc<i32>(entries * k + 1);
    a.top_logprobs = dalloc<float>(entries * k + 1);
    a.entries = reinterpret_cast<u32*>(dalloc_scratch(4 * (2 * entries + 1)));
    a.rows = rows;
    a.max_step_tokens = s;
    a.max_bsz = max_bsz;
    a.real_bsz = real_bsz;
    a.vocab = vocab;
    a.top_k = k;
    a.vec = vec_ok(a.logits, sizeof(raw), vocab);
    launch(SPECULA_ENTRY(accept_logprobs_pack), 1, 1, SPECULA_BATCH_BLOCK, a, 1);
    if (entries > 0) launch(SPECULA_ENTRY(accept_logprobs), (u32)entries, 1, SEL_BLOCK, a, 2);
    run.out("cu_accept", a.cu_accept, max_bsz + 1);
    run.out("token_ids", a.token_ids, entries);
    run.out("logprobs", a.logprobs, entries);
    run.out("ranks", a.ranks, entries);
    run.out("top_ids", a.top_ids, entries * k);
    run.out("top_logprobs", a.top_logprobs, entries * k);
}

static void run_process(const Run& run) {
    const u32 vocab = (u32)run.arg(4);
    // The block: every row, or rows FIRST .. FIRST + BLOCK_ROWS of the scores.
    const bool block = run.argc > 16;
    const u64 first = block ? run.arg(15) : 0;
    const u32 rows = block ? (u32)run.arg(16) : (u32)run.arg(3);
    // The ids the rows hold: the whole vocabulary, or SLICE_FIRST .. SLICE_FIRST + SLICE_LEN.
    const bool sliced = run.argc > 18;
    const u32 width = sliced ? (u32)run.arg(18) : vocab;
    ProcessArgs a;
    memset(&a, 0, sizeof a);
    a.first = first;
    a.rows = rows;
    a.vocab = vocab;
    a.slice_first = sliced ? (u32)run.arg(17) : 0u;
    a.width = width;
    a.real_bsz = (u32)run.arg(6);
    a.max_step_tokens = run.arg(7);
    a.max_model_len = run.arg(8);
    a.n_end = run.arg(9);
    a.n_bias = run.arg(10);
    a.n_bad_words = run.arg(11);
    a.logits = (u32)run.arg(12);
    a.scores = run.in<raw>("probs");
    a.temperature = run.in_if<float>(a.logits != 0, "temperature");
    a.cu_out = run.in<i32>("cu_out");
    a.batch_id = run.in<i32>("batch_id");
    a.token_ids_all = run.in<i32>("token_ids_all");
    a.prompt_lens = run.in<i32>("prompt_lens");
    a.step_idx = run.in<i32>("step_idx");
    a.draft_tokens = run.in<i32>("draft_tokens");
    a.token_counts = run.in<i32>("token_counts");
    a.prompt_mask = run.in<u32>("prompt_mask");
    a.penalties = run.in<float>("penalties");
    a.min_tokens = run.in<i32>("min_tokens");
    a.end_tokens = run.in<i32>("end_tokens");
    a.bias_offsets = run.in<i32>("bias_offsets");
    a.bias_ids = run.in<i32>("bias_ids");
    a.bias_values = run.in<float>("bias_values");
    a.bad_word_offsets = run.in<i32>("bad_word_offsets");
    a.bad_words = run.in<i32>("bad_words");
    a.allowed = run.in_if<u32>(run.arg(13) != 0, "allowed");
    a.bitmask = run.in_if<u32>(run.arg(14) != 0, "bitmask");
    a.processed = dalloc<float>((u64)rows * width);
    a.fallback = dalloc_filled<i32>(rows, -7);
    // Garbage in the outputs: every element must be written.
    memset(a.processed, 0x5a, sizeof(float) * (u64)rows * width);
    if (rows > 0) launch(SPECULA_ENTRY(process_logits), rows, 1, SPECULA_ROW_BLOCK, a, 2);
    run.out("processed", a.processed, (u64)rows * width);
    run.out("fallback", a.fallback, rows);
}

// The batch ops on one batch: DIR MAX_BSZ REAL_BSZ S CAPACITY ROW_BYTES TOKEN_NUM MAX_MODEL_LEN
// THRESHOLD MIN_N MAX_N N_END.
struct Batch {
    u32 max_bsz, real_bsz;
    u64 s, capacity, row_bytes, token_num, max_model_len, threshold;
    u32 min_n, max_n;
    u64 n_end;

    explicit Batch(const Run& run)
        : max_bsz((u32)run.arg(3)), real_bsz((u32)run.arg(4)), s(run.arg(5)), capacity(run.arg(6)),
          row_bytes(run.arg(7)), token_num(run.arg(8)), max_model_len(run.arg(9)), threshold(run.arg(10)),
          min_n((u32)run.arg(11)), max_n((u32)run.arg(12)), n_end(run.arg(13)) {}
};

static LayoutArgs run_layout(const Run& run, const Batch& b, const i32* this_time, const i32* encoder) {
    LayoutArgs l;
    l.this_time = this_time;
    l.encoder = encoder;
    l.seq_lens_output = dalloc<i32>(b.max_bsz);
    l.cu_in = dalloc<i32>(b.real_bsz + 1);
    l.cu_out = dalloc<i32>(b.real_bsz + 1);
    l.batch_id = dalloc<i32>(b.capacity);
    l.capacity = b.capacity;
    l.max_step_tokens = b.s;
    l.max_bsz = b.max_bsz;
    l.real_bsz = b.real_bsz;
    launch(SPECULA_ENTRY(build_output_layout), 1, 1, SPECULA_BATCH_BLOCK, l, 1);
    run.out("seq_lens_output", l.seq_lens_output, b.max_bsz);
    run.out("cu_in", l.cu_in, b.real_bsz + 1);
    run.out("cu_out", l.cu_out, b.real_bsz + 1);
    run.out("batch_id", l.batch_id, b.capacity);
    return l;
}

// build_sampling_params over the layout just built.
static void run_sampling_params(const Run& run, const Batch& b, const LayoutArgs& l) {
    SamplingParamsArgs p;
    p.slot_top_p = run.in<float>("slot_top_p");
    p.slot_top_k = run.in<i32>("slot_top_k");
    p.slot_temperature = run.in<float>("slot_temperature");
    p.slot_seed = run.in<u64>("slot_seed");
    p.this_time = l.this_time;
    p.encoder = l.encoder;
    p.cu_out = l.cu_out;
    p.batch_id = l.batch_id;
    p.top_p = dalloc<float>(b.capacity);
    p.top_k = dalloc<i32>(b.capacity);
    p.temperature = dalloc<float>(b.capacity);
    p.seed = dalloc<u64>(b.capacity);
    p.rows = b.capacity;
    p.max_step_tokens = b.s;
    p.real_bsz = b.real_bsz;
    p.pad = 0;
    if (b.capacity > 0)
        launch(SPECULA_ENTRY(build_sampling_params), blocks_for(b.capacity, SPECULA_BATCH_BLOCK), 1,
               SPECULA_BATCH_BLOCK, p, 1);
    run.out("top_p", p.top_p, b.capacity);
    run.out("top_k", p.top_k, b.capacity);
    run.out("temperature", p.temperature, b.capacity);
    run.out("seed", p.seed, b.capacity);
}

// gather_next_token over the layout, speculative then not.
static void run_gather(const Run& run, const Batch& b, const LayoutArgs& l) {
    for (int spec = 1; spec >= 0; --spec) {
        GatherArgs g;
        g.src = run.in<u8>("hidden");
        const u64 out_rows = spec ? b.capacity : b.max_bsz;
        g.dst = dalloc<u8>(out_rows * b.row_bytes + 1);
        memset(g.dst, 0xAB, out_rows * b.row_bytes);
        g.cu_seqlens_q = l.cu_in;
        g.this_time = l.this_time;
        g.encoder = l.encoder;
        g.cu_out = l.cu_out;
        g.batch_id = l.batch_id;
        g.row_bytes = b.row_bytes;
        g.token_num = b.token_num;
        g.max_step_tokens = b.s;
        g.out_rows = (u32)out_rows;
        g.real_bsz = b.real_bsz;
        g.speculative = (u32)spec;
        g.unit = (b.row_bytes % 4 == 0) ? 4 : 2;
        if (out_rows > 0) launch(SPECULA_ENTRY(gather_next_token), (u32)out_rows, 1, SPECULA_BATCH_BLOCK, g, 4);
        run.out(spec ? "gather_spec" : "gather_plain", g.dst, out_rows * b.row_bytes);
    }
}

// update_state; with `counts`, also token_counts (token_counts.bin, VOCAB entries per slot).
static void run_update_state(const Run& run, const Batch& b, bool counts = false, u64 vocab = 0) {
    UpdateStateArgs u;
    u.token_counts = run.in_if<i32>(counts, "token_counts");
    u.vocab = counts ? vocab : 0;
    u.accept_tokens = run.in<i32>("accept_tokens");
    u.is_block_step = run.in<u8>("is_block_step");
    u.prompt_lens = run.in<i32>("prompt_lens");
    u.max_dec_len = run.in<i32>("max_dec_len");
    u.end_tokens = run.in<i32>("end_tokens");
    u.accept_num = run.in<i32>("accept_num");
    u.stop_flags = run.in<u8>("stop_flags");
    u.token_ids_all = run.in<i32>("token_ids_all");
    u.step_idx = run.in<i32>("step_idx");
    u.infer_seed = run.in<u64>("infer_seed");
    u.draft_tokens = run.in<i32>("draft_tokens");
    u.encoder = run.in<i32>("encoder");
    u.decoder = run.in<i32>("decoder");
    u.max_model_len = b.max_model_len;
    u.max_step_tokens = b.s;
    u.n_end = b.n_end;
    u.real_bsz = b.real_bsz;
    u.pad = 0;
    if (b.real_bsz > 0)
        launch(SPECULA_ENTRY(update_state), blocks_for(b.real_bsz, SPECULA_BATCH_BLOCK), 1, SPECULA_BATCH_BLOCK, u, 1);
    run.out("u_accept_num", u.accept_num, b.max_bsz);
    run.out("u_stop_flags", u.stop_flags, b.max_bsz);
    run.out("u_token_ids_all", u.token_ids_all, b.max_bsz * b.max_model_len);
    run.out("u_step_idx", u.step_idx, b.max_bsz);
    run.out("u_infer_seed", u.infer_seed, b.max_bsz);
    run.out("u_draft_tokens", u.draft_tokens, b.max_bsz * b.s);
    run.out("u_encoder", u.encoder, b.max_bsz);
    run.out("u_decoder", u.decoder, b.max_bsz);
    if (counts) run.out("u_token_counts", u.token_counts, b.max_bsz * vocab);
}

// ngram_match on the history before update_state (fresh copies).
static void run_ngram(const Run& run, const Batch& b) {
    NgramArgs n;
    n.token_ids_all = run.in<i32>("token_ids_all");
    n.prompt_lens = run.in<i32>("prompt_lens");
    n.step_idx = run.in<i32>("step_idx");
    n.draft_token_num = run.in<i32>("draft_token_num");
    n.encoder = run.in<i32>("encoder");
    n.max_dec_len = run.in<i32>("max_dec_len");
    n.draft_tokens = run.in<i32>("draft_tokens");
    n.this_time = run.in<i32>("this_time");
    n.proposals = reinterpret_cast<u64*>(dalloc_scratch(8 * (2 * (u64)b.real_bsz + 1)));
    n.max_model_len = b.max_model_len;
    n.max_step_tokens = b.s;
    n.threshold = b.threshold;
    n.real_bsz = b.real_bsz;
    n.min_ngram = b.min_n;
    n.max_ngram = b.max_n;
    n.pad = 0;
    if (b.real_bsz > 0) {
        launch(SPECULA_ENTRY(ngram_match_propose), b.real_bsz, 1, SPECULA_BATCH_BLOCK, n, 4);
        launch(SPECULA_ENTRY(ngram_match), 1, 1, SPECULA_BATCH_BLOCK, n, 1);
    }
    run.out("n_draft_tokens", n.draft_tokens, b.max_bsz * b.s);
    run.out("n_this_time", n.this_time, b.max_bsz);
}

static void run_batch(const Run& run) {
    const Batch b(run);
    const LayoutArgs l = run_layout(run, b, run.in<i32>("this_time"), run.in<i32>("encoder"));
    run_sampling_params(run, b, l);
    run_gather(run, b, l);
    run_update_state(run, b);
    run_ngram(run, b);
}

// ---- the sharded ops: ROWS LEN FIRST at arguments 3-5 ----

// The rows of a sharded kernel's `a`: the scores, with LOGITS their temperatures, the row keys,
// with MIN_P the per-row min_p.
template <class Args> static void read_shard_rows(const Run& run, Args& a, bool logits, bool min_p) {
    a.rows = (u32)run.arg(3);
    a.len = (u32)run.arg(4);
    a.first = (u32)run.arg(5);
    a.scores = run.in<raw>("scores");
    a.temperature = run.in_if<float>(logits, "temperature");
    a.row_key = run.in<u64>("row_key");
    a.min_p = run.in_if<float>(min_p, "min_p");
    a.logits = logits ? 1u : 0u;
    // shard_walk reads its tokens one by one, in rank order: no vector flag.
    if constexpr (requires { a.vec; }) a.vec = vec_ok(a.scores, sizeof(raw), a.len);
}

static void run_shard_key(const Run& run) {
    ShardKeyArgs a;
    a.rows = (u32)run.arg(3);
    a.len = (u32)run.arg(4);
    a.first = (u32)run.arg(5);
    a.order = (u32)run.arg(6);
    a.logits = (u32)run.arg(7);
    a.scores = run.in<raw>("scores");
    a.ids = run.in_if<i32>(run.arg(8) != 0, "ids");
    a.keys = dalloc_filled<u64>(a.rows, 0x5a5a5a5aull);
    a.vec = vec_ok(a.scores, sizeof(raw), a.len);
    launch(SPECULA_ENTRY(shard_key), a.rows, 1, SHARD_BLOCK, a, 2);
    run.out("keys", a.keys, a.rows);
}

static void run_shard_records(const Run& run) {
    ShardRecordsArgs a;
    read_shard_rows(run, a, run.arg(8) != 0, run.arg(9) != 0);
    a.records_per_row = (u32)run.arg(6);
    a.order = (u32)run.arg(7);
    a.pad = 0;
    const u64 n = 2ull * a.rows * a.records_per_row;
    a.records = dalloc_filled<u64>(n, 0x5a5a5a5aull);
    launch(SPECULA_ENTRY(shard_records), a.rows, 1, SHARD_BLOCK, a, 2);
    run.out("records", a.records, n);
}

static void run_shard_histogram(const Run& run) {
    ShardHistogramArgs a;
    read_shard_rows(run, a, run.arg(7) != 0, run.arg(8) != 0);
    a.shift = (u32)run.arg(6);
    a.prefix = run.in<u64>("prefix");
    a.floors = run.in<u64>("floor");
    a.counts = dalloc_filled<u64>(256ull * a.rows, 0x5a5a5a5aull);
    a.masses = dalloc_filled<u64>(256ull * a.rows, 0x5a5a5a5aull);
    launch(SPECULA_ENTRY(shard_histogram), a.rows, 1, SHARD_BLOCK, a, 2);
    run.out("counts", a.counts, 256ull * a.rows);
    run.out("masses", a.masses, 256ull * a.rows);
}

static void run_shard_walk(const Run& run) {
    ShardWalkArgs a;
    read_shard_rows(run, a, run.arg(6) != 0, run.arg(7) != 0);
    a.draft_rows = (u32)run.arg(8);
    a.threshold = run.in<u64>("threshold");
    a.offset = run.in<u64>("offset");
    const bool residual = a.draft_rows > 0;
    a.draft = run.in_if<raw>(residual, "draft");
    a.draft_key = run.in_if<u64>(residual, "draft_key");
    a.draft_row = run.in_if<i32>(residual, "draft_row");
    a.target_mass = run.in_if<u64>(residual, "target_mass");
    a.draft_mass = run.in_if<u64>(residual, "draft_mass");
    a.tokens = dalloc_filled<i32>(a.rows, -7);
    a.mass = dalloc_filled<u64>(a.rows, 0x5a5a5a5aull);
    a.count = dalloc_filled<u64>(a.rows, 0x5a5a5a5aull);
    a.pad = 0;
    launch(SPECULA_ENTRY(shard_walk), a.rows, 1, SHARD_BLOCK, a, 2);
    run.out("tokens", a.tokens, a.rows);
    run.out("mass", a.mass, a.rows);
    run.out("count", a.count, a.rows);
}

static void run_shard_exp_sum(const Run& run) {
    ShardExpSumArgs a;
    a.rows = (u32)run.arg(3);
    a.len = (u32)run.arg(4);
    a.logits = run.in<raw>("scores");
    a.temperature = run.in<float>("temperature");
    a.row_key = run.in<u64>("row_key");
    a.sums = dalloc_filled<float>(a.rows, -7.0f);
    launch(SPECULA_ENTRY(shard_exp_sum), a.rows, 1, SHARD_BLOCK, a, 2);
    run.out("sums", a.sums, a.rows);
}

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "usage: driver KIND DIR ARGS...\n"); return 2; }
    const std::string kind = argv[1];
    const Run run{std::string(argv[2]) + "/", argc, argv};
    arena_init((size_t)1 << 31);
    if (kind == "sample") run_sample(run);
    else if (kind == "candidates") run_candidates(run);
    else if (kind == "argmax") run_argmax(run);
    else if (kind == "softmax") run_softmax(run);
    else if (kind == "verify") run_verify(run);
    else if (kind == "logprobs") run_logprobs(run);
    else if (kind == "batch") run_batch(run);
    else if (kind == "process") run_process(run);
    else if (kind == "counts") run_update_state(run, Batch(run), true, run.arg(14));
    else if (kind == "shard_key") run_shard_key(run);
    else if (kind == "shard_records") run_shard_records(run);
    else if (kind == "shard_histogram") run_shard_histogram(run);
    else if (kind == "shard_walk") run_shard_walk(run);
    else if (kind == "shard_exp_sum") run_shard_exp_sum(run);
    else {
        fprintf(stderr, "unknown kind %s\n", kind.c_str());
        return 2;
    }
    return 0;
}
