# One line per fuzz target: its name (tests/fuzz/fuzz_<name>.cpp, seeds in tests/fuzz/<name>/)
# and the engine sources it exercises. Also read by tests/CMakeLists.txt for the CI runs.
me_fuzz_target(hostlist ${ME_ROOT}/engine/launch/hostlist.cpp)
me_fuzz_target(store_message ${ME_ROOT}/engine/launch/store_protocol.cpp)
me_fuzz_target(idx ${ME_ROOT}/engine/data/indexed_dataset.cpp)
me_fuzz_target(jsonl_record ${ME_ROOT}/engine/data/jsonl_record.cpp)
me_fuzz_target(overrides)
