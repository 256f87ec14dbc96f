//! Offset solutions of the slab problems this thread searched lately, recalled when the same
//! problem comes again.
//!
//! The fitter compiles one step many times (the unfitted plan, the weights cast each step, the
//! loss head in chunks, each recomputation it weighs), and several of those compiles hand the
//! offset solver the same problem: resnet50 at 224, batch 128, bf16 fitted to 2,916,900,864
//! bytes solved 44 problems of which 10 repeated an earlier one, each costing the solver's whole
//! search budget (docs/benchmarks.md, session 44). The solver is deterministic, so the answer
//! recalled is the answer the search would give again: plans do not change.
//!
//! Only searched problems are kept (a greedy answer costs less than the comparison), the last
//! [`KEPT`] of them, per thread (a compile runs on one thread; tests running side by side do not
//! see each other's).

use ingot_dsa as dsa;
use std::cell::RefCell;

/// How many searched problems each thread keeps.
const KEPT: usize = 8;

struct Solved {
    problem: dsa::Problem,
    options: dsa::SolveOptions,
    solution: dsa::Solution,
}

thread_local! {
    static RECENT: RefCell<Vec<Solved>> = const { RefCell::new(Vec::new()) };
}

/// [`dsa::solve`]'s solution of `problem`, recalled when this thread searched the same problem
/// under the same options lately. The flag says whether it was recalled.
pub(crate) fn solve(
    problem: &dsa::Problem,
    options: &dsa::SolveOptions,
) -> Result<(dsa::Solution, bool), dsa::DsaError> {
    let recalled = RECENT.with(|r| {
        r.borrow()
            .iter()
            .find(|s| s.options == *options && s.problem == *problem)
            .map(|s| s.solution.clone())
    });
    if let Some(solution) = recalled {
        return Ok((solution, true));
    }
    let (solution, stats) = dsa::solve(problem, options)?;
    if stats.nodes_explored > 0 {
        RECENT.with(|r| {
            let mut r = r.borrow_mut();
            if r.len() == KEPT {
                r.remove(0);
            }
            r.push(Solved {
                problem: problem.clone(),
                options: options.clone(),
                solution: solution.clone(),
            });
        });
    }
    Ok((solution, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers 0 and 1 live together, 2 after both: LOAD 150 is not reachable at alignment 64,
    /// so the solver searches (and proves 164).
    fn searched() -> dsa::Problem {
        let b = |id, lower, upper, size| dsa::Buffer {
            id,
            lower,
            upper,
            size,
        };
        dsa::Problem {
            buffers: vec![b(0, 0, 2, 100), b(1, 1, 3, 50), b(2, 3, 4, 120)],
            alignment: 64,
        }
    }

    #[test]
    fn a_searched_problem_solved_again_is_recalled_with_the_same_offsets() {
        let p = searched();
        let opts = dsa::SolveOptions::default();
        let (fresh, stats) = dsa::solve(&p, &opts).unwrap();
        assert!(stats.nodes_explored > 0, "the example must need the search");
        let (first, recalled_first) = solve(&p, &opts).unwrap();
        let (second, recalled_second) = solve(&p, &opts).unwrap();
        assert!(!recalled_first);
        assert!(recalled_second);
        assert_eq!(first, fresh);
        assert_eq!(second, fresh);
    }

    #[test]
    fn other_options_or_another_problem_are_solved_afresh() {
        let p = searched();
        let opts = dsa::SolveOptions::default();
        solve(&p, &opts).unwrap();
        let fewer = dsa::SolveOptions {
            node_limit: 1_000,
            ..opts.clone()
        };
        assert!(!solve(&p, &fewer).unwrap().1);
        let mut q = p.clone();
        q.buffers[2].size = 121;
        let (solution, recalled) = solve(&q, &opts).unwrap();
        assert!(!recalled);
        dsa::validate(&q, &solution).unwrap();
    }

    #[test]
    fn a_thread_keeps_only_its_last_searched_problems() {
        let opts = dsa::SolveOptions::default();
        let problems: Vec<dsa::Problem> = (0..=KEPT as u64)
            .map(|k| {
                let mut p = searched();
                p.buffers[0].size = 100 + k;
                p
            })
            .collect();
        for p in &problems {
            assert!(!solve(p, &opts).unwrap().1);
        }
        // The first was pushed out by the KEPT after it; the last is still there.
        assert!(solve(&problems[KEPT], &opts).unwrap().1);
        assert!(!solve(&problems[0], &opts).unwrap().1);
    }
}
