#pragma once
// REMAT_ARG: options structs with chained setters, shared by every component (the solver's
// SolveOptions, the profiler's ProfileOptions, the models' options).

/// Declares an option with a chained setter and a getter, like PyTorch's TORCH_ARG.
#define REMAT_ARG(T, name)                                        \
 public:                                                          \
  inline auto name(const T& new_value)->decltype(*this) {         \
    this->name##_ = new_value;                                    \
    return *this;                                                 \
  }                                                               \
  inline const T& name() const noexcept { return this->name##_; } \
                                                                  \
 private:                                                         \
  T name##_
