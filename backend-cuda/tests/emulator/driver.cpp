// Runs one Specula kernel on the host emulator (shim.hpp). Prepended by the test with the defines,
// the shim, common.cuh, select.cuh and the kernel files.
//
//   driver sample     DIR ROWS VOCAB OFFSET SPLITS STRIDE   (probs top_k top_p seed -> tokens)
//   driver candidates DIR ROWS VOCAB OFFSET C               (probs top_p -> ids scores lens)
//   driver argmax     DIR ROWS VOCAB OFFSET                 (probs -> tokens)
//   driver logprobs   DIR ROWS VOCAB OFFSET K  (logits temperature tokens -> logprobs ranks top_ids top_logprobs)

#include <string>

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

template <class T> static T* upload(const std::string& path, size_t offset_elems = 0) {
    const std::vector<unsigned char> data = read_file(path);
    T* p = dalloc<T>(data.size() / sizeof(T) + offset_elems + 1) + offset_elems;
    memcpy(p, data.data(), data.size());
    return p;
}

static u32 vec_ok(const void* p, size_t elem, u32 vocab) {
    return ((uintptr_t)p % (4 * elem) == 0 && vocab % 4 == 0) ? 1u : 0u;
}

int main(int argc, char** argv) {
    if (argc < 6) { fprintf(stderr, "usage\n"); return 2; }
    const std::string kind = argv[1], dir = std::string(argv[2]) + "/";
    const u32 rows = (u32)atoi(argv[3]), vocab = (u32)atoi(argv[4]);
    const size_t offset = (size_t)atoi(argv[5]);
    arena_init((size_t)1 << 31);
    typedef SPECULA_T::raw raw;
    if (kind == "sample") {
        const u32 splits = (u32)atoi(argv[6]);
        const u64 stride = (u64)atoll(argv[7]);
        SampleArgs a;
        a.probs = upload<raw>(dir + "probs.bin", offset);
        a.top_k = upload<i32>(dir + "top_k.bin");
        a.top_p = upload<float>(dir + "top_p.bin");
        a.seed = upload<u64>(dir + "seed.bin");
        a.tokens = dalloc<i32>(rows);
        for (u32 r = 0; r < rows; ++r) a.tokens[r] = -7;
        a.rows = rows;
        a.vocab = vocab;
        a.vec = vec_ok(a.probs, sizeof(raw), vocab);
        a.splits = splits;
        a.scratch_stride = stride;
        a.scratch = splits > 1 ? dalloc<unsigned char>(stride * rows) : nullptr;
        if (splits > 1)
            launch(SPECULA_ENTRY(top_k_top_p_sample_split), splits, rows, SEL_BLOCK, a, splits * rows);
        else
            launch(SPECULA_ENTRY(top_k_top_p_sample), rows, 1, SEL_BLOCK, a, 2);
        write_file(dir + "tokens.out", a.tokens, 4ull * rows);
    } else if (kind == "candidates") {
        const u32 c = (u32)atoi(argv[6]);
        CandidatesArgs a;
        a.probs = upload<raw>(dir + "probs.bin", offset);
        a.top_p = upload<float>(dir + "top_p.bin");
        a.batch_id = upload<i32>(dir + "batch_id.bin");
        a.ids = dalloc<i32>((u64)rows * c);
        a.scores = dalloc<float>((u64)rows * c);
        a.lens = dalloc<i32>(rows);
        a.rows = rows;
        a.vocab = vocab;
        a.candidates = c;
        a.vec = vec_ok(a.probs, sizeof(raw), vocab);
        launch(SPECULA_ENTRY(top_p_candidates), rows, 1, SEL_BLOCK, a, 2);
        write_file(dir + "ids.out", a.ids, 4ull * rows * c);
        write_file(dir + "scores.out", a.scores, 4ull * rows * c);
        write_file(dir + "lens.out", a.lens, 4ull * rows);
    } else if (kind == "argmax") {
        ArgmaxArgs a;
        a.input = upload<raw>(dir + "probs.bin", offset);
        a.out = dalloc<i32>(rows);
        a.rows = rows;
        a.vocab = vocab;
        a.vec = vec_ok(a.input, sizeof(raw), vocab);
        launch(SPECULA_ENTRY(argmax), rows, 1, SPECULA_ROW_BLOCK, a, 2);
        write_file(dir + "tokens.out", a.out, 4ull * rows);
    } else if (kind == "verify") {
        // argv: ... OFFSET MAX_BSZ REAL_BSZ S STRATEGY ACCEPT_ALL REJECT_ALL C N_END
        VerifyArgs a;
        memset(&a, 0, sizeof a);
        const u32 max_bsz = (u32)atoi(argv[6]), real_bsz = (u32)atoi(argv[7]);
        const u64 s = (u64)atoll(argv[8]);
        a.strategy = (u32)atoi(argv[9]);
        a.accept_all = (u32)atoi(argv[10]);
        a.reject_all = (u32)atoi(argv[11]);
        a.candidates = (u64)atoll(argv[12]);
        a.n_end = (u64)atoll(argv[13]);
        a.rows = rows;
        a.vocab = vocab;
        a.max_bsz = max_bsz;
        a.real_bsz = real_bsz;
        a.max_step_tokens = s;
        a.draft_tokens = upload<i32>(dir + "draft_tokens.bin");
        a.this_time = upload<i32>(dir + "this_time.bin");
        a.encoder = upload<i32>(dir + "encoder.bin");
        a.cu_out = upload<i32>(dir + "cu_out.bin");
        a.stop_flags = upload<u8>(dir + "stop_flags.bin");
        a.is_block_step = upload<u8>(dir + "is_block_step.bin");
        a.reasoning = upload<i32>(dir + "reasoning.bin");
        a.step_idx = upload<i32>(dir + "step_idx.bin");
        a.max_dec_len = upload<i32>(dir + "max_dec_len.bin");
        a.end_tokens = upload<i32>(dir + "end_tokens.bin");
        a.seeds = upload<u64>(dir + "seeds.bin");
        a.accept_tokens = dalloc<i32>(max_bsz * s);
        a.accept_num = dalloc<i32>(max_bsz);
        for (u64 i = 0; i < max_bsz * s; ++i) a.accept_tokens[i] = -9;
        if (a.strategy == SPECULA_STRATEGY_REJECTION) {
            a.target_probs = upload<raw>(dir + "target_probs.bin", offset);
            a.draft_probs = upload<typename SPECULA_D::raw>(dir + "draft_probs.bin");
            a.top_k = upload<i32>(dir + "top_k.bin");
            a.top_p = upload<float>(dir + "top_p.bin");
            a.draft_rows = (u64)max_bsz * (s - 1);
            a.vec_target = vec_ok(a.target_probs, sizeof(raw), vocab);
            a.vec_draft = vec_ok(a.draft_probs, sizeof(typename SPECULA_D::raw), vocab);
            a.stats = dalloc<unsigned char>(32 * rows + 8 * a.draft_rows + 8);
            if (rows + a.draft_rows > 0)
                launch(SPECULA_ENTRY(verify_draft_tokens_rejection_prepare), (u32)(rows + a.draft_rows), 1, SEL_BLOCK, a, 2);
            launch(SPECULA_ENTRY(verify_draft_tokens_rejection), max_bsz, 1, SEL_BLOCK, a, 2);
        } else {
            a.target_tokens = upload<i32>(dir + "target_tokens.bin");
            a.cand_ids = upload<i32>(dir + "cand_ids.bin");
            a.cand_scores = upload<float>(dir + "cand_scores.bin");
            a.cand_lens = upload<i32>(dir + "cand_lens.bin");
            launch(SPECULA_ENTRY(verify_draft_tokens), (max_bsz + SPECULA_BATCH_BLOCK - 1) / SPECULA_BATCH_BLOCK, 1,
                   SPECULA_BATCH_BLOCK, a, 1);
        }
        write_file(dir + "accept_tokens.out", a.accept_tokens, 4ull * max_bsz * s);
        write_file(dir + "accept_num.out", a.accept_num, 4ull * max_bsz);
    } else if (kind == "logprobs") {
        // argv: ... OFFSET MAX_BSZ REAL_BSZ S K
        LogprobsArgs a;
        memset(&a, 0, sizeof a);
        const u32 max_bsz = (u32)atoi(argv[6]), real_bsz = (u32)atoi(argv[7]);
        const u64 s = (u64)atoll(argv[8]);
        const u32 k = (u32)atoi(argv[9]);
        const u64 entries = (u64)max_bsz * s;
        a.logits = upload<raw>(dir + "probs.bin", offset);
        a.temperature = upload<float>(dir + "temperature.bin");
        a.accept_tokens = upload<i32>(dir + "accept_tokens.bin");
        a.accept_num = upload<i32>(dir + "accept_num.bin");
        a.encoder = upload<i32>(dir + "encoder.bin");
        a.cu_out = upload<i32>(dir + "cu_out.bin");
        a.cu_accept = dalloc<i32>(max_bsz + 1);
        a.token_ids = dalloc<i32>(entries);
        a.logprobs = dalloc<float>(entries);
        a.ranks = dalloc<i32>(entries);
        a.top_ids = dalloc<i32>(entries * k + 1);
        a.top_logprobs = dalloc<float>(entries * k + 1);
        a.entries = dalloc<u32>(2 * entries + 1);
        a.rows = rows;
        a.max_step_tokens = s;
        a.max_bsz = max_bsz;
        a.real_bsz = real_bsz;
        a.vocab = vocab;
        a.top_k = k;
        a.vec = vec_ok(a.logits, sizeof(raw), vocab);
        launch(SPECULA_ENTRY(accept_logprobs_pack), 1, 1, SPECULA_BATCH_BLOCK, a, 1);
        if (entries > 0) launch(SPECULA_ENTRY(accept_logprobs), (u32)entries, 1, SEL_BLOCK, a, 2);
        write_file(dir + "cu_accept.out", a.cu_accept, 4ull * (max_bsz + 1));
        write_file(dir + "token_ids.out", a.token_ids, 4ull * entries);
        write_file(dir + "logprobs.out", a.logprobs, 4ull * entries);
        write_file(dir + "ranks.out", a.ranks, 4ull * entries);
        write_file(dir + "top_ids.out", a.top_ids, 4ull * entries * k);
        write_file(dir + "top_logprobs.out", a.top_logprobs, 4ull * entries * k);
    } else if (kind == "batch") {
        // argv: DIR MAX_BSZ REAL_BSZ S CAPACITY ROW_BYTES TOKEN_NUM MAX_MODEL_LEN THRESHOLD MIN_N MAX_N N_END
        const u32 max_bsz = rows, real_bsz = vocab;  // (positional reuse)
        const u64 s = (u64)atoll(argv[5]), capacity = (u64)atoll(argv[6]), row_bytes = (u64)atoll(argv[7]);
        const u64 token_num = (u64)atoll(argv[8]), max_model_len = (u64)atoll(argv[9]), threshold = (u64)atoll(argv[10]);
        const u32 min_n = (u32)atoi(argv[11]), max_n = (u32)atoi(argv[12]);
        const u64 n_end = (u64)atoll(argv[13]);
        const i32* this_time = upload<i32>(dir + "this_time.bin");
        const i32* encoder = upload<i32>(dir + "encoder.bin");
        // build_output_layout
        LayoutArgs l;
        l.this_time = this_time;
        l.encoder = encoder;
        l.seq_lens_output = dalloc<i32>(max_bsz);
        l.cu_in = dalloc<i32>(real_bsz + 1);
        l.cu_out = dalloc<i32>(real_bsz + 1);
        l.batch_id = dalloc<i32>(capacity);
        l.capacity = capacity;
        l.max_step_tokens = s;
        l.max_bsz = max_bsz;
        l.real_bsz = real_bsz;
        launch(SPECULA_ENTRY(build_output_layout), 1, 1, SPECULA_BATCH_BLOCK, l, 1);
        write_file(dir + "seq_lens_output.out", l.seq_lens_output, 4ull * max_bsz);
        write_file(dir + "cu_in.out", l.cu_in, 4ull * (real_bsz + 1));
        write_file(dir + "cu_out.out", l.cu_out, 4ull * (real_bsz + 1));
        write_file(dir + "batch_id.out", l.batch_id, 4ull * capacity);
        // build_sampling_params over the layout just built
        SamplingParamsArgs p;
        p.slot_top_p = upload<float>(dir + "slot_top_p.bin");
        p.slot_top_k = upload<i32>(dir + "slot_top_k.bin");
        p.slot_temperature = upload<float>(dir + "slot_temperature.bin");
        p.slot_seed = upload<u64>(dir + "slot_seed.bin");
        p.this_time = this_time;
        p.encoder = encoder;
        p.cu_out = l.cu_out;
        p.batch_id = l.batch_id;
        p.top_p = dalloc<float>(capacity);
        p.top_k = dalloc<i32>(capacity);
        p.temperature = dalloc<float>(capacity);
        p.seed = dalloc<u64>(capacity);
        p.rows = capacity;
        p.max_step_tokens = s;
        p.real_bsz = real_bsz;
        p.pad = 0;
        if (capacity > 0)
            launch(SPECULA_ENTRY(build_sampling_params), (u32)((capacity + SPECULA_BATCH_BLOCK - 1) / SPECULA_BATCH_BLOCK), 1,
                   SPECULA_BATCH_BLOCK, p, 1);
        write_file(dir + "top_p.out", p.top_p, 4ull * capacity);
        write_file(dir + "top_k.out", p.top_k, 4ull * capacity);
        write_file(dir + "temperature.out", p.temperature, 4ull * capacity);
        write_file(dir + "seed.out", p.seed, 8ull * capacity);
        // gather_next_token, speculative then not
        for (int spec = 1; spec >= 0; --spec) {
            GatherArgs g;
            g.src = upload<u8>(dir + "hidden.bin");
            const u64 out_rows = spec ? capacity : max_bsz;
            g.dst = dalloc<u8>(out_rows * row_bytes + 1);
            memset(g.dst, 0xAB, out_rows * row_bytes);
            g.cu_seqlens_q = l.cu_in;
            g.this_time = this_time;
            g.encoder = encoder;
            g.cu_out = l.cu_out;
            g.batch_id = l.batch_id;
            g.row_bytes = row_bytes;
            g.token_num = token_num;
            g.max_step_tokens = s;
            g.out_rows = (u32)out_rows;
            g.real_bsz = real_bsz;
            g.speculative = (u32)spec;
            g.unit = (row_bytes % 4 == 0) ? 4 : 2;
            if (out_rows > 0) launch(SPECULA_ENTRY(gather_next_token), (u32)out_rows, 1, SPECULA_BATCH_BLOCK, g, 4);
            write_file(dir + (spec ? "gather_spec.out" : "gather_plain.out"), g.dst, out_rows * row_bytes);
        }
        // update_state
        UpdateStateArgs u;
        u.accept_tokens = upload<i32>(dir + "accept_tokens.bin");
        u.is_block_step = upload<u8>(dir + "is_block_step.bin");
        u.prompt_lens = upload<i32>(dir + "prompt_lens.bin");
        u.max_dec_len = upload<i32>(dir + "max_dec_len.bin");
        u.end_tokens = upload<i32>(dir + "end_tokens.bin");
        u.accept_num = upload<i32>(dir + "accept_num.bin");
        u.stop_flags = upload<u8>(dir + "stop_flags.bin");
        u.token_ids_all = upload<i32>(dir + "token_ids_all.bin");
        u.step_idx = upload<i32>(dir + "step_idx.bin");
        u.infer_seed = upload<u64>(dir + "infer_seed.bin");
        u.draft_tokens = upload<i32>(dir + "draft_tokens.bin");
        u.encoder = upload<i32>(dir + "encoder.bin");
        u.decoder = upload<i32>(dir + "decoder.bin");
        u.max_model_len = max_model_len;
        u.max_step_tokens = s;
        u.n_end = n_end;
        u.real_bsz = real_bsz;
        u.pad = 0;
        if (real_bsz > 0)
            launch(SPECULA_ENTRY(update_state), (real_bsz + SPECULA_BATCH_BLOCK - 1) / SPECULA_BATCH_BLOCK, 1, SPECULA_BATCH_BLOCK, u, 1);
        write_file(dir + "u_accept_num.out", u.accept_num, 4ull * max_bsz);
        write_file(dir + "u_stop_flags.out", u.stop_flags, 1ull * max_bsz);
        write_file(dir + "u_token_ids_all.out", u.token_ids_all, 4ull * max_bsz * max_model_len);
        write_file(dir + "u_step_idx.out", u.step_idx, 4ull * max_bsz);
        write_file(dir + "u_infer_seed.out", u.infer_seed, 8ull * max_bsz);
        write_file(dir + "u_draft_tokens.out", u.draft_tokens, 4ull * max_bsz * s);
        write_file(dir + "u_encoder.out", u.encoder, 4ull * max_bsz);
        write_file(dir + "u_decoder.out", u.decoder, 4ull * max_bsz);
        // ngram_match on the history before update_state (fresh copies)
        NgramArgs n;
        n.token_ids_all = upload<i32>(dir + "token_ids_all.bin");
        n.prompt_lens = upload<i32>(dir + "prompt_lens.bin");
        n.step_idx = upload<i32>(dir + "step_idx.bin");
        n.draft_token_num = upload<i32>(dir + "draft_token_num.bin");
        n.encoder = upload<i32>(dir + "encoder.bin");
        n.max_dec_len = upload<i32>(dir + "max_dec_len.bin");
        n.draft_tokens = upload<i32>(dir + "draft_tokens.bin");
        n.this_time = upload<i32>(dir + "this_time.bin");
        n.proposals = dalloc<u64>(2 * real_bsz + 1);
        n.max_model_len = max_model_len;
        n.max_step_tokens = s;
        n.threshold = threshold;
        n.real_bsz = real_bsz;
        n.min_ngram = min_n;
        n.max_ngram = max_n;
        n.pad = 0;
        if (real_bsz > 0) {
            launch(SPECULA_ENTRY(ngram_match_propose), real_bsz, 1, SPECULA_BATCH_BLOCK, n, 4);
            launch(SPECULA_ENTRY(ngram_match), 1, 1, SPECULA_BATCH_BLOCK, n, 1);
        }
        write_file(dir + "n_draft_tokens.out", n.draft_tokens, 4ull * max_bsz * s);
        write_file(dir + "n_this_time.out", n.this_time, 4ull * max_bsz);
    } else if (kind == "softmax") {
        SoftmaxArgs a;
        a.logits = upload<raw>(dir + "probs.bin", offset);
        a.temperature = upload<float>(dir + "temperature.bin");
        a.probs = dalloc<float>((u64)rows * vocab);
        a.rows = rows;
        a.vocab = vocab;
        a.vec = vec_ok(a.logits, sizeof(raw), vocab);
        a.pad = 0;
        launch(SPECULA_ENTRY(softmax), rows, 1, SPECULA_ROW_BLOCK, a, 2);
        write_file(dir + "probs.out", a.probs, 4ull * rows * vocab);
    } else {
        fprintf(stderr, "unknown kind %s\n", kind.c_str());
        return 2;
    }
    return 0;
}
