// Model sharing, the fetcher side (model_fetch): a model planned here with no file of it is
// fetched chunk by chunk from its holders over bulk links, each chunk checked against the chunk
// table of the content id in the plan. The holder side: model_share.cpp.
#include "mesh/serving/model_share.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/base/msgpack_bounded.hpp"
#include "actors/base/thread.hpp"
#include "mesh/serving/model_share_wire.hpp"

namespace tessera::mesh::serving {

using namespace share_detail;  // with the namespace aliases both halves use

// ------------------------------------------------------------------ fetcher side

std::string_view to_string(model_fetch::state s) noexcept {
  switch (s) {
    case model_fetch::state::idle:
      return "idle";
    case model_fetch::state::connecting:
      return "connecting";
    case model_fetch::state::fetching:
      return "fetching";
    case model_fetch::state::ready:
      return "ready";
    case model_fetch::state::failed:
      return "failed";
  }
  return "?";
}

model_fetch::model_fetch(options o) : opt_(std::move(o)) {
  path_ = (fs::path(opt_.dir) / (opt_.model + ".gguf")).string();
  root_path_ = (fs::path(opt_.dir) / (opt_.model + ".root")).string();
  thread_ = std::thread([this] {
    name_this_thread("share-fetch");
    run();
  });
}

model_fetch::~model_fetch() {
  stop();
  if (fd_ >= 0) ::close(fd_);
}

void model_fetch::stop() {
  {
    // Under the lock: a caller still inside want() / on_answer() (they notify while holding it)
    // is done with cv_ before this object can go away.
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

std::string model_fetch::path() const {
  return path_;
}

void model_fetch::want(std::vector<share_source> sources,
                       std::vector<inference::model::shard_spec> shards) {
  {
    std::lock_guard lock(mu_);
    const bool all_ready = std::all_of(shards.begin(), shards.end(), [&](const auto& s) {
      return std::find(ready_.begin(), ready_.end(), s) != ready_.end();
    });
    const bool same_sources = sources.size() == sources_.size() &&
                              std::equal(sources.begin(), sources.end(), sources_.begin(),
                                         [](const auto& a, const auto& b) {
                                           return a.hex == b.hex && a.backend == b.backend;
                                         });
    sources_ = std::move(sources);
    if (all_ready) return;
    // A new set of shards, or new holders after a failure: fetch again.
    if (shards == wants_ && (same_sources || prog_.st != state::failed)) return;
    wants_ = std::move(shards);
    ++want_gen_;
    cv_.notify_all();  // under the lock: see stop()
  }
}

void model_fetch::on_answer(const std::string& from_hex, const share_setup& answer) {
  {
    std::lock_guard lock(mu_);
    if (prog_.st != state::connecting || prog_.from != from_hex) return;  // stale
    answer_ = answer;
    cv_.notify_all();  // under the lock: see stop()
  }
}

std::optional<chunk_table> model_fetch::complete_table() const {
  std::lock_guard lock(mu_);
  return complete_;
}

bool model_fetch::complete() const {
  std::lock_guard lock(mu_);
  return complete_.has_value();
}

bool model_fetch::ready_for(const inference::model::shard_spec& shard) const {
  std::lock_guard lock(mu_);
  return std::find(ready_.begin(), ready_.end(), shard) != ready_.end();
}

model_fetch::progress model_fetch::snapshot() const {
  std::lock_guard lock(mu_);
  return prog_;
}

void model_fetch::run() {
  std::uint64_t gen = 0;
  bool failed = false;
  while (!stopping_) {
    std::vector<share_source> sources;
    std::vector<inference::model::shard_spec> wants;
    {
      std::unique_lock lock(mu_);
      // After a failure, try again (with whatever holders are known then) every few seconds.
      auto retry = [&] { return stopping_.load() || want_gen_ != done_gen_; };
      if (failed)
        cv_.wait_for(lock, std::chrono::seconds(5),
                     [&] { return stopping_.load() || want_gen_ != gen; });
      else
        cv_.wait(lock, retry);
      if (stopping_) return;
      if (want_gen_ == done_gen_) continue;
      gen = want_gen_;
      sources = sources_;
      wants = wants_;
      ++prog_.attempts;
      prog_.st = state::connecting;
    }
    const auto t0 = clock_type::now();
    auto r = safe_name(opt_.model)
                 ? fetch_once(sources, wants)
                 : result<void>(make_error(errc::invalid_argument,
                                           "model name '{}' cannot name a file", opt_.model));
    {
      std::lock_guard lock(mu_);
      if (r) {
        for (const auto& w : wants)
          if (std::find(ready_.begin(), ready_.end(), w) == ready_.end()) ready_.push_back(w);
        if (want_gen_ == gen) done_gen_ = gen;
        prog_.st = state::ready;
        prog_.error.clear();
        prog_.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
        failed = false;
      } else {
        prog_.st = state::failed;
        prog_.error = r.error().describe();
        failed = true;
      }
    }
    if (r)
      spdlog::info("model share: '{}' ready ({} fetched in {:.2f} s)", opt_.model,
                   gguf::human_bytes(prog_.fetched_bytes), prog_.seconds);
    else
      spdlog::warn("model share: fetching '{}' failed: {}", opt_.model, r.error().describe());
    if (opt_.on_change) opt_.on_change();
  }
}

result<void> model_fetch::fetch_once(const std::vector<share_source>& sources,
                                     const std::vector<inference::model::shard_spec>& shards) {
  if (sources.empty())
    return make_error(errc::no_capacity, "model '{}': no live peer holds its content {}",
                      opt_.model, opt_.root.substr(0, 16));
  std::string errors;
  for (const auto& s : sources) {
    if (stopping_) return make_error(errc::cancelled, "node stopping");
    auto r = fetch_from(s, shards);
    if (r) return ok();
    if (!errors.empty()) errors += "; ";
    errors += fmt::format("from {}: {}", s.hex, r.error().describe());
  }
  return make_error(errc::no_capacity, "model '{}': {}", opt_.model, errors);
}

result<void> model_fetch::open_store(const chunk_table& t) {
  std::error_code ec;
  fs::create_directories(opt_.dir, ec);
  if (ec) return make_error(errc::io, "{}: cannot create: {}", opt_.dir, ec.message());
  std::string have_root;
  {
    std::ifstream in(root_path_);
    std::getline(in, have_root);
  }
  const bool reuse = have_root == opt_.root && fs::file_size(path_, ec) == t.file_size && !ec;
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (reuse ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) return make_error(errc::io, "{}: cannot open: {}", path_, std::strerror(errno));
  have_.assign(t.chunks(), false);
  if (reuse) {
    // Bytes a previous run fetched: kept when they still hash right.
    std::vector<std::byte> buf(static_cast<std::size_t>(t.chunk_bytes));
    std::uint64_t kept = 0;
    for (std::uint64_t i = 0; i < t.chunks(); ++i) {
      const auto r = t.chunk_range(i);
      if (!pread_all(fd_, buf.data(), r.size, r.offset, path_)) continue;
      if (t.matches(i, {buf.data(), r.size})) {
        have_[i] = true;
        ++kept;
      }
    }
    spdlog::info("model share: '{}': {} of {} chunks already here", opt_.model, kept, t.chunks());
    return ok();
  }
  if (::ftruncate(fd_, static_cast<off_t>(t.file_size)) != 0)
    return make_error(errc::io, "{}: cannot size to {}: {}", path_, t.file_size,
                      std::strerror(errno));
  std::ofstream out(root_path_, std::ios::trunc);
  out << opt_.root << "\n";
  if (!out) return make_error(errc::io, "{}: cannot write", root_path_);
  return ok();
}

result<void> model_fetch::fetch_from(const share_source& src,
                                     const std::vector<inference::model::shard_spec>& shards) {
  // 1. Set-up over the control plane.
  auto setup = bulk::prepare_link(src.backend, share_link_options(opt_.addresses));
  if (!setup) return setup.error();
  {
    std::lock_guard lock(mu_);
    prog_.st = state::connecting;
    prog_.from = src.hex;
    answer_.reset();
  }
  share_setup offer;
  offer.kind = share_setup::offer;
  offer.fetch_id = opt_.fetch_id;
  offer.model = opt_.model;
  offer.root = opt_.root;
  offer.backend = static_cast<std::uint8_t>(src.backend);
  offer.params = to_u8(bulk::encode((*setup)->local_params()));
  opt_.send(src.hex, offer);
  share_setup answer;
  {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, kShareTimeout, [&] { return stopping_.load() || answer_.has_value(); }))
      return make_error(errc::timeout, "no answer to the share offer within {} ms",
                        kShareTimeout.count());
    if (stopping_) return make_error(errc::cancelled, "node stopping");
    answer = *answer_;
    prog_.st = state::fetching;
  }
  if (!answer.error.empty()) return make_error(errc::not_found, "{}", answer.error);
  auto theirs = params_of(answer.params);
  if (!theirs) return theirs.error();
  auto lk = (*setup)->connect(*theirs);
  if (!lk) return lk.error();
  bulk::link& link = **lk;

  // 2. In-band: hello, the receive buffer, the table.
  std::uint64_t wr = 1;
  std::array<bulk::completion, 16> c;
  std::deque<std::vector<std::byte>> replies;
  // Waits for the next reply (send_received). Completions are taken in batches — every one of
  // them, so our own sends' completions are polled too (a backend may hand received ones first;
  // taking one at a time would leave ours unpolled until the link refuses more) — and replies
  // beyond the first wait in `replies`.
  auto next_reply = [&]() -> result<share_wire> {
    const auto deadline = clock_type::now() + kShareTimeout;
    while (replies.empty()) {
      if (stopping_) return make_error(errc::cancelled, "node stopping");
      auto n = link.wait(c, std::chrono::milliseconds(100));
      if (!n) return n.error();
      for (std::size_t i = 0; i < *n; ++i) {
        if (!c[i].ok()) return *c[i].failure;
        if (c[i].kind == bulk::completion_kind::link_down)
          return make_error(errc::closed, "the holder closed the link");
        if (c[i].kind == bulk::completion_kind::send_received)
          replies.push_back(std::move(c[i].data));
      }
      if (replies.empty() && clock_type::now() > deadline)
        return make_error(errc::timeout, "no reply within {} ms", kShareTimeout.count());
    }
    auto w = unpack_wire(replies.front());
    replies.pop_front();
    if (!w) return w.error();
    if (!w->error.empty()) return make_error(errc::not_found, "the holder says: {}", w->error);
    return w;
  };
  auto ask = [&](share_wire w) { return link.send(pack_wire(w), wr++); };
  share_wire hello;
  hello.op = share_wire::hello;
  hello.model = opt_.model;
  hello.root = opt_.root;
  TESSERA_TRY(ask(hello));
  auto hr = next_reply();
  if (!hr) return hr.error();
  const std::uint64_t slot_bytes = hr->chunk_bytes;
  if (slot_bytes < kMinChunkBytes || slot_bytes > kMaxChunkBytes + (2u << 20) ||
      hr->bytes > slot_bytes)
    return make_error(errc::corrupt, "the holder announced slots of {} bytes and a table of {}",
                      slot_bytes, hr->bytes);
  auto recv = bulk::allocate_buffer(static_cast<std::size_t>(slot_bytes * kShareSlots));
  if (!recv) return recv.error();
  auto rh = link.register_buffer(*recv);
  if (!rh) return rh.error();
  auto rdesc = link.describe(*rh);
  if (!rdesc) return rdesc.error();
  share_wire buf;
  buf.op = share_wire::buffer;
  buf.target = *rdesc;
  buf.slot_bytes = slot_bytes;
  TESSERA_TRY(ask(buf));
  TESSERA_TRY(next_reply());
  share_wire tw;
  tw.op = share_wire::table;
  tw.slot = 0;
  TESSERA_TRY(ask(tw));
  auto tr = next_reply();
  if (!tr) return tr.error();
  if (tr->bytes > slot_bytes) return make_error(errc::corrupt, "table of {} bytes", tr->bytes);
  std::span<const std::uint8_t> tbytes(reinterpret_cast<const std::uint8_t*>(recv->data()),
                                       static_cast<std::size_t>(tr->bytes));
  auto table = decode_chunk_table(tbytes);
  if (!table) return table.error();
  if (content_root(*table) != opt_.root)
    return make_error(errc::corrupt,
                      "the holder's chunk table hashes to {}, not to the model's content {}",
                      content_root(*table).substr(0, 16), opt_.root.substr(0, 16));
  if (!table_) {
    TESSERA_TRY(open_store(*table));
    table_ = *table;
  }
  const chunk_table& t = *table_;

  // 3. Chunks, kShareSlots in flight, each verified before it is written.
  auto fetch_chunks = [&](const std::vector<std::uint64_t>& list) -> result<void> {
    std::vector<std::uint64_t> missing;
    for (auto i : list)
      if (!have_[i]) missing.push_back(i);
    std::array<std::int64_t, kShareSlots> in_slot;
    in_slot.fill(-1);
    std::size_t next = 0, open = 0;
    while (next < missing.size() || open > 0) {
      for (std::uint32_t s = 0; s < kShareSlots && next < missing.size(); ++s) {
        if (in_slot[s] >= 0) continue;
        share_wire g;
        g.op = share_wire::chunk;
        g.index = missing[next];
        g.slot = s;
        TESSERA_TRY(ask(g));
        in_slot[s] = static_cast<std::int64_t>(missing[next++]);
        ++open;
      }
      auto r = next_reply();
      if (!r) return r.error();
      if (r->slot >= kShareSlots || in_slot[r->slot] != static_cast<std::int64_t>(r->index))
        return make_error(errc::corrupt, "a reply for chunk {} in slot {} that was not asked for",
                          r->index, r->slot);
      std::span<const std::byte> bytes(recv->data() + r->slot * slot_bytes,
                                       static_cast<std::size_t>(std::min(r->bytes, slot_bytes)));
      if (!t.matches(r->index, bytes))
        return make_error(errc::corrupt,
                          "chunk {} ({} bytes at {}) does not match the model's hash", r->index,
                          r->bytes, t.chunk_range(r->index).offset);
      TESSERA_TRY(
          pwrite_all(fd_, bytes.data(), bytes.size(), t.chunk_range(r->index).offset, path_));
      have_[r->index] = true;
      in_slot[r->slot] = -1;
      --open;
      std::uint64_t done = 0, total = 0;
      {
        std::lock_guard lock(mu_);
        prog_.bytes_done += bytes.size();
        prog_.fetched_bytes += bytes.size();
        done = prog_.bytes_done;
        total = prog_.bytes_total;
      }
      if (opt_.on_progress) opt_.on_progress(done, total);
    }
    return ok();
  };
  const gguf::byte_range header{0, t.data_offset};
  const auto header_chunks = chunks_covering(t, {&header, 1});
  auto account = [&](const std::vector<std::uint64_t>& list) {
    std::uint64_t total = 0, done = 0;
    for (auto i : list) {
      total += t.chunk_range(i).size;
      if (have_[i]) done += t.chunk_range(i).size;
    }
    std::lock_guard lock(mu_);
    prog_.bytes_total = total;
    prog_.bytes_done = done;
  };
  account(header_chunks);
  TESSERA_TRY(fetch_chunks(header_chunks));
  auto f = gguf::file::open(path_, {gguf::load_mode::headers_only, {}});
  if (!f) return f.error();
  std::vector<gguf::byte_range> ranges{header};
  for (const auto& s : shards) {
    auto r = inference::model::model::file_ranges(*f, {s});
    if (!r) return r.error();
    ranges.insert(ranges.end(), r->begin(), r->end());
  }
  const auto need = chunks_covering(t, ranges);
  account(need);
  TESSERA_TRY(fetch_chunks(need));
  if (::fsync(fd_) != 0)
    return make_error(errc::io, "{}: cannot sync: {}", path_, std::strerror(errno));
  if (std::all_of(have_.begin(), have_.end(), [](bool b) { return b; })) {
    std::lock_guard lock(mu_);
    complete_ = t;
  }
  return ok();
}

}  // namespace tessera::mesh::serving
