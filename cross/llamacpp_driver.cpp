// llamacpp_driver.cpp - llama.cpp's side of cross/count_instructions.py --peer llamacpp: the same
// work as cross/greedy_check.py --markers does with edgellama, through llama.h. Loads a model,
// evaluates the prompt ids in one llama_decode, then N single-token decode steps (argmax of the last
// logits each), on one thread, with getppid() before and after every decode (the markers
// cross/insn-count-plugin.c reports the instruction count at) the first one ending the load.
// Prints one JSON line: the generated ids and the context settings used.
// Usage: llamacpp-driver MODEL PROMPT_IDS(comma-separated) N_GEN N_CTX FLASH_ATTN(auto|on|off)
// Built and linked statically by cross/build_llamacpp.py.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

// what flash attention resolved to at context creation ("auto" is decided by a probe that logs it)
static const char *fa_resolved = "not logged";

static void quiet(enum ggml_log_level level, const char *text, void *) {
    if (strstr(text, "Flash Attention")) fa_resolved = strstr(text, "not supported") ? "disabled" : "enabled";
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);  // errors only: the JSON line is the output
}

static std::vector<llama_token> parse_ids(const char *s) {
    std::vector<llama_token> ids;
    while (*s) {
        char *end = nullptr;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "bad prompt id list at \"%s\"\n", s);
            exit(2);
        }
        ids.push_back((llama_token)v);
        s = *end == ',' ? end + 1 : end;
    }
    return ids;
}

static llama_token argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;  // first maximum, like numpy's argmax
    return best;
}

static void decode(llama_context *ctx, llama_token *ids, int n) {
    getppid();
    int rc = llama_decode(ctx, llama_batch_get_one(ids, n));
    getppid();
    if (rc != 0) {
        fprintf(stderr, "llama_decode failed (%d)\n", rc);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL PROMPT_IDS N_GEN N_CTX auto|on|off\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> prompt = parse_ids(argv[2]);
    int n_gen = atoi(argv[3]), n_ctx = atoi(argv[4]);
    const std::string fa = argv[5];
    if (prompt.empty() || n_gen < 1 || n_ctx < (int)prompt.size() + n_gen || (fa != "auto" && fa != "on" && fa != "off")) {
        fprintf(stderr, "need a prompt, N_GEN >= 1, N_CTX >= prompt + N_GEN, flash attention auto|on|off\n");
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)prompt.size();  // the whole prompt in one ubatch, as edgellama
    cp.n_threads = cp.n_threads_batch = 1;
    cp.no_perf = true;
    cp.flash_attn_type = fa == "on"    ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                         : fa == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                       : LLAMA_FLASH_ATTN_TYPE_AUTO;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    // the first decode's opening marker ends the load (context creation included, as edgellama's LLM())
    decode(ctx, prompt.data(), (int)prompt.size());
    std::vector<llama_token> out;
    for (int i = 0; i < n_gen; i++) {
        llama_token tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        out.push_back(tok);
        decode(ctx, &tok, 1);
    }
    printf("{\"tokens\": [");
    for (size_t i = 0; i < out.size(); i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"n_ctx\": %u, \"n_ubatch\": %u, \"flash_attn\": \"%s\", \"flash_attn_resolved\": \"%s\"}\n",
           llama_n_ctx(ctx), llama_n_ubatch(ctx), fa.c_str(), fa == "auto" ? fa_resolved : fa == "on" ? "enabled" : "disabled");
    fflush(stdout);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
