// `megaengine export CHECKPOINT --format hf --out DIR` and `megaengine import HF_DIR --out DIR`:
// checkpoints to and from Hugging Face transformers model directories (engine/hf/convert.h).
#pragma once

namespace me::lua {

// argv after "export" / "import"; returns the exit status (0, 1 on bad input, 2 on bad usage).
int export_main(int argc, char** argv);
int import_main(int argc, char** argv);

}  // namespace me::lua
