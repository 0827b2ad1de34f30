// `megaengine checkpoint inspect DIR [--verify]`: what a checkpoint holds, read from its
// metadata (and, with --verify, every shard's size and checksum checked).
#pragma once

namespace me::lua {

// argv after "checkpoint"; returns the exit status (0, 1 on a bad checkpoint, 2 on bad usage).
int checkpoint_main(int argc, char** argv);

}  // namespace me::lua
