#include "engine/comm/job_store.h"

namespace me::comm {
JobStore::JobStore(const launch::StoreAddress& address, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds connect_timeout)
    : c10d::Store(timeout), client_(address, connect_timeout.count() > 0 ? connect_timeout : timeout) {}

#if ME_C10D_STORE_HAS_CLONE
c10::intrusive_ptr<c10d::Store> JobStore::clone() {
  return c10::make_intrusive<JobStore>(client_.address(), timeout_);
}
#endif

launch::store::Frame JobStore::request(launch::store::Op op, std::vector<std::string> fields, int64_t number) {
  return client_.call(launch::store::Frame{static_cast<uint8_t>(op), number, std::move(fields)}, timeout_);
}

void JobStore::missing(const std::vector<std::string>& keys, std::chrono::milliseconds waited) const {
  std::string names;
  for (const auto& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
  fail("rendezvous store: ", names, " did not appear within ", waited.count() / 1000.0,
       " s (the rank that publishes it has not got that far, or died)");
}

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  request(launch::store::Op::set, {key, store_text(value)});
}

std::vector<uint8_t> JobStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return store_bytes(request(launch::store::Op::compare_set, {key, store_text(expected), store_text(desired)}).fields.at(0));
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  // A key deleted between the wait and the get (no user of ours does that) is waited for again.
  while (true) {
    wait({key}, timeout_);
    if (auto value = client_.get(key, timeout_)) return store_bytes(*value);
  }
}

int64_t JobStore::add(const std::string& key, int64_t value) { return client_.add(key, value, timeout_); }

bool JobStore::deleteKey(const std::string& key) { return client_.erase(key, timeout_); }

bool JobStore::check(const std::vector<std::string>& keys) { return client_.check(keys, timeout_); }

int64_t JobStore::getNumKeys() { return request(launch::store::Op::num_keys, {}).number; }

void JobStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void JobStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  if (!client_.wait(keys, timeout)) missing(keys, timeout);
}

#if ME_C10D_STORE_HAS_EXTENDED_API
void JobStore::append(const std::string& key, const std::vector<uint8_t>& value) {
  request(launch::store::Op::append, {key, store_text(value)});
}

std::vector<std::vector<uint8_t>> JobStore::multiGet(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
  const auto reply = request(launch::store::Op::multi_get, keys);
  ME_CHECK(reply.code == static_cast<uint8_t>(launch::store::Reply::ok) && reply.fields.size() == keys.size(),
           "rendezvous store: multiGet of ", keys.size(), " keys: a key was deleted while it was read");
  std::vector<std::vector<uint8_t>> out;
  for (const auto& v : reply.fields) out.push_back(store_bytes(v));
  return out;
}

void JobStore::multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
  ME_CHECK(keys.size() == values.size(), "rendezvous store: multiSet of ", keys.size(), " keys and ", values.size(),
           " values");
  std::vector<std::string> fields;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    fields.push_back(keys[i]);
    fields.push_back(store_text(values[i]));
  }
  request(launch::store::Op::multi_set, std::move(fields));
}
#endif

}  // namespace me::comm
