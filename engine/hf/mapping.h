// How our model's tensors and config correspond to Hugging Face transformers' (LlamaForCausalLM
// and GPT2LMHeadModel): one table per model family (hf_mapping.cpp), read in both directions by
// export and import, so that a new tensor is added in one place. Each row names our tensor (as
// in the whole model, "blocks.{i}.attn.qkv.weight"), its Hugging Face tensor(s) and the
// transform between them; shapes follow from the config. Torch-free (hf_convert.h moves the
// tensors).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/transformer_config.h"

namespace me::hf {

enum class Family { llama, gpt2 };

// How our tensor becomes its Hugging Face tensor(s), and back.
enum class Transform {
  copy,         // the same values
  conv1d,       // GPT-2's Conv1D keeps weights as [in, out]: transposed (biases copied)
  vocab_rows,   // our rows are the padded vocabulary; Hugging Face's the real one
  position,     // learned positions: Hugging Face may hold more (n_positions) than model.seq
  qkv_grouped,  // our fused QKV (per key/value group: its query heads, its key, its value) <-> q, k, v
  qkv_conv1d,   // our fused QKV <-> GPT-2's c_attn: [all queries | all keys | all values], Conv1D
  gate_up,      // our SwiGLU rows interleaved (gate 0, up 0, gate 1, ...) <-> gate_proj, up_proj
};

// One of our tensors with its layer index filled in.
struct TensorMap {
  std::string ours;             // "blocks.3.attn.qkv.weight" (the checkpoint's "model." prefix not included)
  std::vector<std::string> hf;  // "model.layers.3.self_attn.q_proj.weight", ...
  Transform transform = Transform::copy;
  std::vector<int64_t> shape;   // ours, with the real (unpadded) vocabulary
  std::vector<std::vector<int64_t>> hf_shapes;
};

// The family whose architecture the config has: LLaMA (RMSNorm, SwiGLU, RoPE) or GPT-2
// (LayerNorm, GeLU, learned positions, biases, multi-head attention). me::Error listing what
// fits neither.
Family family_of(const model::TransformerConfig& c);
const char* family_name(Family f);  // "llama", "gpt2"

// Every tensor of the model, in Hugging Face's order (embeddings, layers, final norm, head).
std::vector<TensorMap> tensor_maps(const model::TransformerConfig& c);

// The names a Hugging Face tensor may be saved under: GPT-2's own files (OpenAI's weights on the
// Hub) leave out GPT2LMHeadModel's "transformer." prefix.
std::vector<std::string> hf_name_variants(const std::string& name);

// Hugging Face tensors that a model does not load (buffers some versions saved, the tied head).
bool ignorable_hf_tensor(const std::string& name, const model::TransformerConfig& c);

// config.json for the model. `dtype`: "float32", "bfloat16" or "float16"; bos/eos: -1 when unknown.
std::string config_json(const model::TransformerConfig& c, const std::string& dtype, int64_t bos, int64_t eos);
// The model config.json describes (vocab_divisible_by and the training-only fields keep their
// defaults). me::Error naming `file` and the field for what we cannot build (rope scaling, a
// head_dim other than hidden / heads, an activation other than the family's...).
model::TransformerConfig config_from_json(const std::string& text, const std::string& file);
// The torch_dtype config.json names ("" when absent).
std::string dtype_from_config(const std::string& text, const std::string& file);

// me::Error listing every field where the recipe's model and config.json's differ (hidden,
// heads, query groups, vocab, layers, ffn, rope base, norm epsilon, tied embeddings, the
// architecture), each with both values; nothing when they agree.
void check_matches(const model::TransformerConfig& from_hf, const model::TransformerConfig& recipe,
                   const std::string& file);

}  // namespace me::hf
