// The connection layer under cpp-httplib (http_transport.h): bind options, the reactor that reads requests under
// deadlines, the request threads, and the stream that serves a buffered request to httplib.
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "core/log.h"

namespace dsv4 {

namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_socket = -1;
thread_local size_t t_stream_buffer = 0;                // the request thread's max_stream_buffer
thread_local std::shared_ptr<ChunkedStream> t_detached;  // the response of the request being processed, detached

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }
int poll_ms(double s) { return int(std::max(0.0, s) * 1000.0); }

bool iequal_prefix(std::string_view line, std::string_view name) {
  if (line.size() < name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) != name[i]) return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

void addr_text(const sockaddr_storage& ss, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

}  // namespace

// ---- a connection and its request as read so far ------------------------------------------------------------------

struct HttpServer::Conn {
  enum class Phase { idle, header, body };
  int fd = -1;
  std::string buf;              // bytes read and not yet consumed by httplib (the request, then what follows it)
  size_t scanned = 0;           // header end searched up to here
  size_t header_end = 0;        // 0: header incomplete
  size_t need = 0;              // Content-Length requests: header_end + length
  size_t chunk_pos = 0;         // chunked requests: the next chunk-size line
  size_t request_end = 0;       // a complete request: where it ends in buf (0: unknown, close after it)
  bool chunked = false;
  Phase phase = Phase::idle;
  Clock::time_point deadline;

  void reset_request() {
    scanned = header_end = need = chunk_pos = request_end = 0;
    chunked = false;
    phase = Phase::idle;
  }
};

// What httplib reads and writes: the buffered request first, then the socket (with timeouts).
class HttpServer::BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(Conn& c, const HttpTransportOptions& o) : c_(c), o_(o) {}
  size_t consumed() const { return pos_; }

  bool is_readable() const override {
    if (pos_ < c_.buf.size()) return true;
    pollfd p{c_.fd, POLLIN, 0};
    return ::poll(&p, 1, poll_ms(o_.read_timeout_s)) > 0 && (p.revents & POLLIN);
  }
  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, poll_ms(o_.write_timeout_s)) > 0 && (p.revents & POLLOUT) &&
           !(p.revents & (POLLERR | POLLHUP));
  }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < c_.buf.size()) {
      const size_t n = std::min(size, c_.buf.size() - pos_);
      std::memcpy(ptr, c_.buf.data() + pos_, n);
      pos_ += n;
      return ssize_t(n);
    }
    if (!is_readable()) return -1;
    ssize_t n;
    do n = ::recv(c_.fd, ptr, size, 0);
    while (n < 0 && errno == EINTR);
    if (n > 0) {  // keep the bookkeeping simple: what was read from the socket counts as buffered and consumed
      c_.buf.append(ptr, size_t(n));
      pos_ += size_t(n);
    }
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getpeername(c_.fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) addr_text(ss, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getsockname(c_.fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) addr_text(ss, ip, port);
  }
  socket_t socket() const override { return c_.fd; }

 private:
  Conn& c_;
  const HttpTransportOptions& o_;
  size_t pos_ = 0;
};

// httplib's task queue for the accept loop: a connection is handed to the reactor on the accepting thread.
class HttpServer::Queue final : public httplib::TaskQueue {
 public:
  explicit Queue(HttpServer& s) : s_(s) { s_.start(); }
  void enqueue(std::function<void()> fn) override { fn(); }  // runs process_and_close_socket: returns at once
  void shutdown() override { s_.shutdown(); }

 private:
  HttpServer& s_;
};

// ---- setup ----------------------------------------------------------------------------------------------------------

HttpServer::HttpServer() {
  // SO_REUSEADDR (rebinding a port in TIME_WAIT) but not SO_REUSEPORT: a port with a listener fails with EADDRINUSE
  set_socket_options([](socket_t s) {
    int yes = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  new_task_queue = [this] { return new Queue(*this); };
  set_transport(opts_);
}

HttpServer::~HttpServer() {
  if (started_) shutdown();
}

void HttpServer::set_transport(const HttpTransportOptions& o) {
  opts_ = o;
  if (opts_.workers <= 0) opts_.workers = 32;
  const auto whole = [](double s) { return time_t(s); };
  const auto micro = [](double s) { return time_t((s - double(time_t(s))) * 1e6); };
  set_read_timeout(whole(opts_.read_timeout_s), micro(opts_.read_timeout_s));
  set_write_timeout(whole(opts_.write_timeout_s), micro(opts_.write_timeout_s));
  set_keep_alive_timeout(std::max<time_t>(1, whole(opts_.idle_timeout_s)));  // what the Keep-Alive header says
}

int HttpServer::bind_port(const std::string& host, int port, std::string& error) {
  errno = 0;
  const int p = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (p <= 0) {
    const int e = errno;
    error = e == EADDRINUSE ? "the address is already in use (another server on this port?)"
            : e != 0        ? std::strerror(e)
                            : "the address is not available";
    return -1;
  }
  // httplib listens with a backlog of 5: a burst of connections would see dropped SYNs (1 s retransmits). Linux
  // takes a second listen() on the socket as a new backlog (capped by net.core.somaxconn).
  ::listen(svr_sock_, 4096);
  return p;
}

int HttpServer::current_socket() { return t_socket; }

std::shared_ptr<ChunkedStream> HttpServer::detach_current() {
  if (t_socket < 0) return nullptr;
  if (!t_detached) t_detached = std::make_shared<ChunkedStream>(t_socket, t_stream_buffer);
  return t_detached;
}

void HttpServer::request_flush(std::shared_ptr<ChunkedStream> s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    flush_.push_back(std::move(s));
  }
  const uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof one);
}

// The response is over or the connection is lost: the stream lets go of the reactor; `gone`: lost before done().
void HttpServer::release_stream(ChunkedStream& s, bool gone) {
  std::function<void()> g, closed;
  {
    std::lock_guard lk(s.mu_);
    s.server_ = nullptr;
    if (gone && !s.ended_) g = std::move(s.gone_);
    s.ok_ = false;
    closed = std::move(s.closed_);
    s.gone_ = nullptr;
  }
  --streaming_;
  if (g) g();
  if (closed) closed();
}

HttpServer::Stats HttpServer::stats() const {
  Stats s;
  s.open = open_;
  s.waiting = waiting_;
  s.busy = busy_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queued = int64_t(ready_.size());
  }
  s.timed_out = timed_out_;
  s.refused = refused_;
  s.requests = requests_;
  s.streaming = streaming_;
  return s;
}

void HttpServer::start() {
  // enough descriptors for max_connections (the soft limit is often 1024)
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max &&
      rl.rlim_cur < rlim_t(opts_.max_connections) + 64) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, rlim_t(opts_.max_connections) + 64);
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rlim_t(opts_.max_connections) + 64)
    log::info("http: the descriptor limit ({}) allows fewer than {} connections", uint64_t(rl.rlim_cur),
              opts_.max_connections);
  stopping_ = false;
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wakefd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wakefd_;
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
  started_ = true;
  reactor_ = std::thread([this] { reactor_loop(); });
  for (int i = 0; i < opts_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void HttpServer::shutdown() {
  if (!started_) return;
  stopping_ = true;
  const uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof one);
  if (reactor_.joinable()) reactor_.join();
  std::deque<std::unique_ptr<Conn>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready.swap(ready_);
  }
  cv_.notify_all();
  for (auto& c : ready) close_conn(std::move(c), "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                                                 "Content-Length: 0\r\n\r\n");
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::vector<std::unique_ptr<Conn>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(incoming_);
  }
  for (auto& c : left) close_conn(std::move(c), nullptr);
  std::vector<std::pair<std::unique_ptr<Conn>, std::shared_ptr<ChunkedStream>>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.swap(incoming_streams_);
    flush_.clear();
  }
  for (auto& [c, st] : streams) {
    close_conn(std::move(c), nullptr);
    release_stream(*st, true);
  }
  ::close(epfd_);
  ::close(wakefd_);
  epfd_ = wakefd_ = -1;
  started_ = false;
}

// ---- accept -> reactor -> request threads ---------------------------------------------------------------------------

bool HttpServer::process_and_close_socket(socket_t sock) {
  if (stopping_ || open_.load() >= opts_.max_connections) {
    ++refused_;
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return false;
  }
  ++open_;
  int yes = 1;  // streamed tokens go out as they are written
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  auto c = std::make_unique<Conn>();
  c->fd = sock;
  watch(std::move(c));
  return true;
}

void HttpServer::watch(std::unique_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming_.push_back(std::move(c));
  }
  const uint64_t one = 1;
  (void)!::write(wakefd_, &one, sizeof one);
}

void HttpServer::close_conn(std::unique_ptr<Conn> c, const char* reply) {
  if (reply) (void)!::send(c->fd, reply, std::strlen(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(c->fd, SHUT_RDWR);
  ::close(c->fd);
  --open_;
}

// Read what arrived; `done`: the connection is to be closed (with `reply`, if set); `dispatch`: the request is
// complete.
void HttpServer::on_readable(Conn& c, bool& done, bool& dispatch, const char*& reply) {
  char tmp[16384];
  for (;;) {
    const ssize_t n = ::recv(c.fd, tmp, sizeof tmp, MSG_DONTWAIT);
    if (n > 0) {
      if (c.phase == Conn::Phase::idle) {
        c.phase = Conn::Phase::header;
        c.deadline = Clock::now() + seconds(opts_.header_timeout_s);
      }
      c.buf.append(tmp, size_t(n));
      if (size_t(n) < sizeof tmp) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // closed by the client (0) or failed: a request completed before a half-close is still served
    done = true;
    break;
  }
  if (done) {
    bool complete = false;
    if (!c.buf.empty() && parse(c, complete, reply) && complete) {
      done = false;
      dispatch = true;
      ::shutdown(c.fd, SHUT_RD);  // nothing more to read: the connection closes after the response
    }
    return;
  }
  if (c.buf.empty()) return;
  bool complete = false;
  if (!parse(c, complete, reply)) done = true;
  dispatch = complete;
}

// The request in c.buf so far: `complete` once it can go to a request thread. false: close (with `reply`).
bool HttpServer::parse(Conn& c, bool& complete, const char*& reply) {
  complete = false;
  if (c.phase == Conn::Phase::idle) {  // leftover bytes of a pipelined request
    c.phase = Conn::Phase::header;
    c.deadline = Clock::now() + seconds(opts_.header_timeout_s);
  }
  if (c.header_end == 0) {
    const size_t from = c.scanned >= 3 ? c.scanned - 3 : 0;
    const size_t p = c.buf.find("\r\n\r\n", from);
    if (p == std::string::npos) {
      c.scanned = c.buf.size();
      if (c.buf.size() > opts_.max_header_bytes) {
        reply = "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
        return false;
      }
      return true;
    }
    c.header_end = p + 4;
    size_t length = 0;
    bool has_length = false;
    size_t expect_at = 0, expect_len = 0;  // the Expect header line, CRLF included
    size_t form_at = 0, form_len = 0;      // a form-urlencoded Content-Type value (json_bodies: becomes JSON)
    std::string_view head(c.buf.data(), p + 2);
    for (size_t pos = head.find("\r\n"); pos != std::string_view::npos && pos + 2 < head.size();) {
      const size_t next = head.find("\r\n", pos + 2);
      const std::string_view line = head.substr(pos + 2, next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string_view::npos) {
        const std::string_view value = trim(line.substr(colon + 1));
        if (iequal_prefix(line, "content-length:")) {
          // 1*DIGIT (RFC 9110 §8.6); a sign, other characters or more than 19 digits: 400, the connection closed
          if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string_view::npos) {
            reply = "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: application/json\r\n"
                    "Content-Length: 82\r\n\r\n"
                    "{\"error\": {\"message\": \"invalid Content-Length\", \"type\": \"invalid_request_error\"}}\n";
            return false;
          }
          length = size_t(std::strtoull(std::string(value).c_str(), nullptr, 10));
          has_length = true;
        }
        else if (iequal_prefix(line, "transfer-encoding:")) c.chunked = lower(value).find("chunked") != std::string::npos;
        else if (iequal_prefix(line, "expect:") && lower(value) == "100-continue") {
          expect_at = pos + 2;
          expect_len = next + 2 - expect_at;
        } else if (opts_.json_bodies && iequal_prefix(line, "content-type:") &&
                   iequal_prefix(value, "application/x-www-form-urlencoded")) {
          form_at = size_t(value.data() - c.buf.data());
          form_len = value.size();
        }
      }
      pos = next;
    }
    c.phase = Conn::Phase::body;
    c.deadline = Clock::now() + seconds(opts_.body_timeout_s);
    if (length > payload_max_length_) {  // refused unread (413): httplib answers from the header
      complete = true;
      return true;
    }
    // Header edits, the later one first so that the earlier one's offset stays valid.
    auto take_form_as_json = [&] {
      if (form_len == 0) return;
      static constexpr std::string_view kJson = "application/json";
      c.buf.replace(form_at, form_len, kJson);
      c.header_end = c.header_end + kJson.size() - form_len;
    };
    if (form_at > expect_at) take_form_as_json();
    if (expect_len > 0) {  // the client waits for "100 Continue": answer it here, and httplib never sees the Expect
      c.buf.erase(expect_at, expect_len);
      c.header_end -= expect_len;
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)!::send(c.fd, kContinue, sizeof kContinue - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    if (form_at < expect_at) take_form_as_json();
    if (!has_length && !c.chunked) {  // no body (RFC 9112 §6.3); httplib would refuse a POST without a length
      static const char kNoBody[] = "Content-Length: 0\r\n";
      c.buf.insert(c.header_end - 2, kNoBody);
      c.header_end += sizeof kNoBody - 1;
    }
    c.need = c.header_end + length;
    c.chunk_pos = c.header_end;
  }
  if (!c.chunked) {
    complete = c.buf.size() >= c.need;
    if (complete) c.request_end = c.need;
    return true;
  }
  // chunked body: size line, data, CRLF ... up to the last chunk and its trailer
  for (;;) {
    const size_t eol = c.buf.find("\r\n", c.chunk_pos);
    if (eol == std::string::npos) return true;
    const size_t size = size_t(std::strtoull(c.buf.substr(c.chunk_pos, eol - c.chunk_pos).c_str(), nullptr, 16));
    if (size == 0) {  // the last chunk, then trailer lines up to an empty one
      const size_t end = c.buf.compare(eol + 2, 2, "\r\n") == 0 ? eol + 4 : c.buf.find("\r\n\r\n", eol);
      complete = end != std::string::npos;
      if (complete) c.request_end = end == eol + 4 ? end : end + 4;
      return true;
    }
    if (c.buf.size() - c.header_end > payload_max_length_) {  // httplib refuses it
      complete = true;
      return true;
    }
    if (eol + 2 + size + 2 > c.buf.size()) return true;
    c.chunk_pos = eol + 2 + size + 2;
  }
}

void HttpServer::reactor_loop() {
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  struct Detached {
    std::unique_ptr<Conn> c;
    std::shared_ptr<ChunkedStream> s;
    uint32_t events = 0;
  };
  std::unordered_map<int, Detached> detached;  // connections of detached responses (chunked_stream.h)
  std::vector<epoll_event> events(256);
  auto last_scan = Clock::now();
  auto drop = [&](int fd, const char* reply) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
    std::unique_ptr<Conn> c = std::move(it->second);
    conns.erase(it);
    close_conn(std::move(c), reply);
  };
  auto to_worker = [&](int fd) {
    auto it = conns.find(fd);
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
    std::unique_ptr<Conn> c = std::move(it->second);
    conns.erase(it);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(c));
    }
    cv_.notify_one();
  };
  auto readable = [&](Conn& c) {
    bool done = false, dispatch = false;
    const char* reply = nullptr;
    on_readable(c, done, dispatch, reply);
    if (done) {
      drop(c.fd, reply);
    } else if (dispatch) {
      to_worker(c.fd);
    }
  };
  // a connection waiting for its (next) request
  auto add_conn = [&](std::unique_ptr<Conn> c) {
    const int cfd = c->fd;
    c->reset_request();
    c->deadline = Clock::now() + seconds(opts_.idle_timeout_s);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = cfd;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, cfd, &ev) != 0) {
      close_conn(std::move(c), nullptr);
      return;
    }
    Conn& ref = *c;
    conns[cfd] = std::move(c);
    if (!ref.buf.empty()) readable(ref);  // a pipelined request may be complete already
  };
  // detached responses: the stream's connection ends (gone: lost before the response was complete)
  auto end_stream = [&](int fd, bool gone) {
    auto it = detached.find(fd);
    if (it == detached.end()) return;
    Detached d = std::move(it->second);
    detached.erase(it);
    ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
    bool keep = false;
    {
      std::lock_guard lk(d.s->mu_);
      keep = !gone && d.s->keep_alive_ && !d.s->aborted_;
    }
    release_stream(*d.s, gone);
    if (keep && !stopping_) add_conn(std::move(d.c));
    else close_conn(std::move(d.c), nullptr);
  };
  auto set_events = [&](Detached& d, uint32_t want) {
    if (d.events == want) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.fd = d.c->fd;
    ::epoll_ctl(epfd_, EPOLL_CTL_MOD, d.c->fd, &ev);
    d.events = want;
  };
  // writes what the stream has without blocking; EPOLLOUT while some is left
  auto flush = [&](int fd) {
    auto it = detached.find(fd);
    if (it == detached.end()) return;
    Detached& d = it->second;
    ChunkedStream& s = *d.s;
    enum class Next { wait, gone, complete } next = Next::wait;
    bool pending = false;
    {
      std::lock_guard lk(s.mu_);
      s.flush_queued_ = false;
      if (s.aborted_) {
        next = Next::complete;  // closes: no keep-alive after an aborted response
      } else if (!s.ok_) {
        next = Next::gone;
      } else {
        while (s.sent_ < s.out_.size()) {
          const ssize_t n = ::send(fd, s.out_.data() + s.sent_, s.out_.size() - s.sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) {
            s.sent_ += size_t(n);
            s.last_progress_ = Clock::now();
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          next = Next::gone;
          break;
        }
        if (next == Next::wait) {
          if (s.sent_ == s.out_.size()) {
            s.out_.clear();
            s.sent_ = 0;
            if (s.ended_) next = Next::complete;
          } else if (s.sent_ > (64u << 10)) {  // keep the buffer from growing with what was written
            s.out_.erase(0, s.sent_);
            s.sent_ = 0;
          }
          pending = s.sent_ < s.out_.size();
        }
        if (next == Next::gone) s.ok_ = false;
      }
    }
    if (next == Next::gone) {
      end_stream(fd, true);
    } else if (next == Next::complete) {
      end_stream(fd, false);
    } else {
      set_events(d, (d.events & ~uint32_t(EPOLLOUT)) | (pending ? uint32_t(EPOLLOUT) : 0u));
    }
  };
  auto add_stream = [&](std::unique_ptr<Conn> c, std::shared_ptr<ChunkedStream> st) {
    const int cfd = c->fd;
    {
      std::lock_guard lk(st->mu_);
      st->server_ = this;
    }
    epoll_event ev{};
    ev.events = EPOLLRDHUP;
    ev.data.fd = cfd;
    Detached& d = detached[cfd];
    d.c = std::move(c);
    d.s = std::move(st);
    d.events = ev.events;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, cfd, &ev) != 0) {
      end_stream(cfd, true);
      return;
    }
    flush(cfd);
  };
  auto stream_event = [&](Detached& d, uint32_t ev) {
    const int fd = d.c->fd;
    if (ev & (EPOLLHUP | EPOLLERR)) {
      end_stream(fd, true);
      return;
    }
    if (ev & EPOLLRDHUP) {  // the client closed its side: gone, unless the response is complete and being written
      bool ended;
      {
        std::lock_guard lk(d.s->mu_);
        ended = d.s->ended_;
        d.s->keep_alive_ = false;
      }
      if (!ended) {
        end_stream(fd, true);
        return;
      }
      set_events(d, d.events & ~uint32_t(EPOLLRDHUP));
    }
    if (ev & EPOLLOUT) flush(fd);
  };
  // the scan of detached responses: idle chunks, the write deadline; its period
  int tick = 100;  // ms: the epoll wait, and the period of the scan of detached responses
  auto scan_streams = [&](Clock::time_point now) {
    std::vector<int> late;
    Clock::duration t = std::chrono::milliseconds(100);
    for (auto& [fd, d] : detached) {
      ChunkedStream& s = *d.s;
      std::lock_guard lk(s.mu_);
      if (s.idle_interval_.count() > 0) t = std::min(t, s.idle_interval_ / 4);
      if (!s.ok_ || s.aborted_) continue;
      if (s.sent_ < s.out_.size() && now - s.last_progress_ >= seconds(opts_.write_timeout_s)) {
        s.ok_ = false;
        late.push_back(fd);
        continue;
      }
      // the idle chunk (SSE keepalive); append_locked asks for the flush
      if (!s.ended_ && s.idle_interval_.count() > 0 && now - s.last_write_ >= s.idle_interval_)
        s.append_locked(s.idle_chunk_);
    }
    for (int fd : late) {
      ++timed_out_;
      end_stream(fd, true);
    }
    tick = std::max(10, int(std::chrono::duration_cast<std::chrono::milliseconds>(t).count()));
  };
  auto last_stream_scan = Clock::now();
  while (!stopping_) {
    waiting_ = int64_t(conns.size());
    const int n = ::epoll_wait(epfd_, events.data(), int(events.size()), tick);
    if (stopping_) break;
    for (int i = 0; i < n; ++i) {
      const int fd = events[size_t(i)].data.fd;
      if (fd == wakefd_) {
        uint64_t v;
        (void)!::read(wakefd_, &v, sizeof v);
        std::vector<std::unique_ptr<Conn>> in;
        std::vector<std::pair<std::unique_ptr<Conn>, std::shared_ptr<ChunkedStream>>> streams;
        std::vector<std::shared_ptr<ChunkedStream>> flushes;
        {
          std::lock_guard<std::mutex> lock(mu_);
          in.swap(incoming_);
          streams.swap(incoming_streams_);
          flushes.swap(flush_);
        }
        for (auto& c : in) add_conn(std::move(c));
        for (auto& [c, st] : streams) add_stream(std::move(c), std::move(st));
        for (auto& st : flushes) {
          auto it = detached.find(st->fd());
          if (it != detached.end() && it->second.s == st) flush(st->fd());
        }
        continue;
      }
      if (auto it = conns.find(fd); it != conns.end()) {
        readable(*it->second);
        continue;
      }
      if (auto it = detached.find(fd); it != detached.end()) stream_event(it->second, events[size_t(i)].events);
    }
    const auto now = Clock::now();
    if (!detached.empty() && now - last_stream_scan >= std::chrono::milliseconds(tick)) {
      last_stream_scan = now;
      scan_streams(now);
    }
    if (detached.empty()) tick = 100;
    if (now - last_scan >= std::chrono::milliseconds(100)) {
      last_scan = now;
      std::vector<std::pair<int, bool>> expired;  // fd, a request had begun
      for (const auto& [fd, c] : conns)
        if (c->deadline <= now) expired.emplace_back(fd, c->phase != Conn::Phase::idle);
      for (const auto& [fd, begun] : expired) {
        ++timed_out_;
        drop(fd, begun ? "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n" : nullptr);
      }
    }
  }
  for (auto& [fd, c] : conns) close_conn(std::move(c), nullptr);
  conns.clear();
  std::vector<int> left;
  for (auto& [fd, d] : detached) left.push_back(fd);
  for (int fd : left) end_stream(fd, true);
  waiting_ = 0;
}

void HttpServer::worker_loop() {
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
      if (ready_.empty()) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    ++busy_;
    ++requests_;
    t_socket = c->fd;
    t_stream_buffer = opts_.max_stream_buffer;
    bool ok = false, closed = false;
    size_t consumed = 0;
    {
      BufferedStream strm(*c, opts_);
      try {
        ok = process_request(strm, stopping_.load(), closed, nullptr);
      } catch (...) {
        ok = false;
      }
      consumed = strm.consumed();
    }
    t_socket = -1;
    --busy_;
    // a detached response: its connection goes to the reactor, which writes the rest (kept alive afterwards as
    // httplib decided: the content provider ended its part with false, so `ok` says nothing here)
    if (std::shared_ptr<ChunkedStream> st = std::move(t_detached)) {
      const bool keep = !closed && !stopping_ && c->request_end > 0 && consumed <= c->request_end;
      if (keep) c->buf.erase(0, c->request_end);
      else c->buf.clear();
      {
        std::lock_guard lk(st->mu_);
        st->keep_alive_ = keep;
      }
      ++streaming_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        incoming_streams_.emplace_back(std::move(c), std::move(st));
      }
      const uint64_t one = 1;
      (void)!::write(wakefd_, &one, sizeof one);
      continue;
    }
    // keep-alive: back to the reactor with what follows the request (a body the handler did not read, e.g. of a
    // 401, is skipped: the reactor knows where the request ends); a request that was not whole in memory closes
    if (ok && !closed && !stopping_ && c->request_end > 0 && consumed <= c->request_end) {
      c->buf.erase(0, c->request_end);
      watch(std::move(c));
    } else {
      close_conn(std::move(c), nullptr);
    }
  }
}

std::string probe_listen(const std::string& host, int port) {
  if (port == 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || !res) return "the address is not available";
  std::string why = "the address is not available";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);  // as HttpServer: no SO_REUSEPORT
    const bool ok = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    const int e = errno;
    ::close(fd);
    if (ok) {
      why.clear();
      break;
    }
    why = e == EADDRINUSE ? "the address is already in use (another server on this port?)" : std::strerror(e);
  }
  ::freeaddrinfo(res);
  return why;
}

}  // namespace dsv4
