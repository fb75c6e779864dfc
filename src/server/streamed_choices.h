// StreamedChoices: the n choices of one streamed request as a StreamPump task (server/stream_pump.h) — what
// Server's run_choices does on threads, without a thread: choice i gets its GenerationRequest and callbacks; choice 0
// is submitted at once, the others once choice 0's prompt has been computed (its first token or its end) so that
// they reuse its cached blocks, unless it failed or was cancelled by then (they are then cancelled). Each choice is a
// LoopGeneration (engine/loop_generation.h) woken by its tokens. done(i, r) runs when choice i ended without an
// error; finished(results, error) once all have ended (error: the first choice's failure, results then partial).
// Every callback runs on a pump thread, one at a time for a request.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "engine/engine_loop.h"
#include "engine/loop_generation.h"
#include "server/stream_pump.h"

namespace dsv4 {

class StreamedChoices final : public StreamPump::Task {
 public:
  struct Setup {
    EngineLoop* loop = nullptr;
    const Tokenizer* tok = nullptr;
    std::vector<GenerationRequest> reqs;  // one per choice
    std::function<GenerationCallbacks(int)> callbacks;
    std::function<void(int, GenerationResult&)> done;
    std::function<void(std::vector<GenerationResult>&, std::exception_ptr)> finished;
  };
  // Not started: StreamPump::start runs it.
  StreamedChoices(StreamPump& pump, Setup s);
  ~StreamedChoices() override;
  bool run() override;

 private:
  void begin(int i);        // submits choice i
  bool step(int i);         // advances choice i; true when it has ended
  StreamPump& pump_;
  Setup s_;
  std::vector<GenerationResult> results_;
  std::vector<std::exception_ptr> errors_;
  std::vector<bool> ended_;
  bool failed_ = false, others_started_ = false, prefilled_ = false, first_cancelled_ = false, finished_ = false;
  std::vector<std::unique_ptr<LoopGeneration>> gens_;  // last: destroyed first (they cancel what still runs)
};

}  // namespace dsv4
