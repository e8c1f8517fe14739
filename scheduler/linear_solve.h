// The small dense solve behind the step-time fits (elastic_step_model.cc,
// elastic_decode_fit.cc): m x = y for n <= 4 unknowns.
#ifndef MMSERVE_SCHEDULER_LINEAR_SOLVE_H_
#define MMSERVE_SCHEDULER_LINEAR_SOLVE_H_

#include <vector>

namespace mmserve::scheduler {

// Solves the n x n system m x = y by Gaussian elimination with partial
// pivoting; false when a pivot's magnitude is below `min_pivot` (singular).
bool SolveLinearSystem(std::vector<std::vector<double>> m, std::vector<double> y, double min_pivot,
                       std::vector<double>* x);

}  // namespace mmserve::scheduler

#endif  // MMSERVE_SCHEDULER_LINEAR_SOLVE_H_
