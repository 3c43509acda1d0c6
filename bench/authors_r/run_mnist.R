# The authors' stochastic SEP on Fashion-MNIST, with test error and NLL at reporting points.
#
#   Rscript run_mnist.R DATA_DIR OUT_JSONL EPOCHS [PRINT_INTERVAL]
#
# DATA_DIR holds the raw bytes written by export_fashion.py (train/test images and labels);
# one JSON line per reporting point is appended to OUT_JSONL.  The environment variable
# AUTHORS_R_DIR names a checkout of github.com/emakryo/scalable_multiclass_ep (see README.md).
#
# The body is the authors' experiments/mnist/sep_stochastic/simulate_SEP_MNIST_Stochastic.R with
# three changes: the data come from DATA_DIR instead of mnist.dat; the number of epochs is
# EPOCHS (their epMGPCInternal runs max_iters - 1 epochs, `while (i < max_iters)` from i = 1, so
# it is called with max_iters = EPOCHS + 1; their default 250 runs 249) and the reporting interval
# PRINT_INTERVAL minibatches (theirs: 10); and the scores go to JSON lines instead of their
# results/time_outter_1.txt.  Everything else is theirs: set.seed(0) and the shuffle of the
# training rows, inputs / 255, m = 200 inducing points per class at random training rows (drawn
# per class inside epMGPCInternal), minibatches of m = 200 rows, log sigma = log sigma0 = 0, log l
# per class and feature started at the median distance between 1000 random training rows (their
# kernel divides the inputs by sqrt(l)), Adam (step 1e-3) on the hyperparameters and inducing
# points after every minibatch, and their undamped site update (damping 1; the annealing is
# commented out in their code).
#
# Their loop scores the test set after minibatches 1, 1 + P, 1 + 2P, ... (it tests
# count_minibatches %% P == 0 before counting the minibatch), and moves its clock t0 forward by
# each scoring's time, so the CPU seconds reported there are training only.  Their results file is
# written by write.table; the write.table defined below, which their function finds first (it is
# sourced into the global environment), turns that row into a JSON line instead and reads the
# minibatch count from the calling frame.  After the last epoch the returned model is scored once
# more ("final": true), with the CPU seconds of the whole call (including the full-data kernel
# matrices it builds before returning) less the in-loop scorings.

args <- commandArgs(trailingOnly = TRUE)
data_dir <- args[ 1 ]
out_file <- args[ 2 ]
epochs <- as.integer(args[ 3 ])
print_interval <- if (length(args) >= 4) as.integer(args[ 4 ]) else 10
authors <- Sys.getenv("AUTHORS_R_DIR")

source(file.path(authors, "Rcode/sep_code/sepMGPC_stochastic.R"))

read_u8 <- function(part, what, n, d = 1) {
    v <- readBin(file.path(data_dir, sprintf("%s-%s.u8", part, what)), "integer", n = n * d,
                 size = 1, signed = FALSE)
    if (length(v) != n * d) stop(sprintf("%s-%s.u8: %d values, expected %d", part, what, length(v), n * d))
    if (d == 1) v else matrix(as.numeric(v), n, d, byrow = TRUE)
}
n_tr <- file.size(file.path(data_dir, "train-labels.u8"))
n_ts <- file.size(file.path(data_dir, "test-labels.u8"))
data <- list(Xtr = read_u8("train", "images", n_tr, 784), Ytr = read_u8("train", "labels", n_tr),
             Xts = read_u8("test", "images", n_ts, 784), Yts = read_u8("test", "labels", n_ts))

blas <- if (getRversion() >= "4.1.0") basename(dirname(extSoftVersion()[[ "BLAS" ]])) else ""
scoring_cpu <- 0
scoring_elapsed <- 0

json_line <- function(minibatches, n_batches, err, nll, cpu, elapsed, final) {
    line <- sprintf(paste0('{"dataset": "fashion-mnist", "method": "sep-stochastic", "m": %d, ',
                           '"minibatch": %d, "n_train": %d, "n_test": %d, "epochs": %d, ',
                           '"print_interval": %d, "minibatches": %d, "epoch": %.6f, "final": %s, ',
                           '"length_scale_heuristic": %.17g, "error": %.17g, "nll": %.17g, ',
                           '"cpu_s": %.3f, "elapsed_s": %.3f, "r_version": "%s", "blas": "%s"}'),
                    m, m, nrow(X_train), nrow(X_test), epochs, print_interval, minibatches,
                    minibatches / n_batches, if (final) "true" else "false", l, err, nll, cpu,
                    elapsed, R.version.string, blas)
    cat(line, "\n", file = out_file, append = TRUE, sep = "")
    cat("\n", line, "\n", sep = "")
}

# Their reporting row is t(c(err, neg_ll, proc.time() - t0)): error, NLL, then user, system and
# elapsed seconds of training since their (scoring-adjusted) t0.
write.table <- function(x, ...) {
    f <- parent.frame()
    x <- c(x)
    dt <- f$t_after - f$t_before
    scoring_cpu <<- scoring_cpu + dt[[ "user.self" ]] + dt[[ "sys.self" ]]
    scoring_elapsed <<- scoring_elapsed + dt[[ "elapsed" ]]
    json_line(f$count_minibatches + 1, f$nBatches, x[ 1 ], x[ 2 ], x[ 3 ] + x[ 4 ], x[ 5 ], FALSE)
}

set.seed(0)

s <- sample(1 : nrow(data$Xtr))[ 1 : 6e4 ]

data$Xtr <- data$Xtr[ s , ]
data$Ytr <- as.factor(data$Ytr[ s ])
data$Yts <- as.factor(data$Yts)

# Data split
X_train <- data$Xtr
Y_train <- as.factor(data$Ytr)

X_test <- data$Xts
Y_test <- as.factor(data$Yts)

m <- 200

# Normalize

X_train <- (X_train / 255)

X_test <- (X_test / 255)

D <- as.matrix(dist(X_train[ sample(1 : nrow(X_train), 1e3), ]))
l <- median(D[ upper.tri(D) ])
log_l = matrix(log(l), 10, ncol(X_train))

REPORT <- TRUE
CONT <- 1

t0 <- proc.time()

ret <- epMGPCInternal(X_train, Y_train, m, m, X_test = X_test, Y_test = Y_test, optim = "adam",
                      print_interval = print_interval, log_l = log_l, max_iters = epochs + 1)

t_after <- proc.time()

dt <- t_after - t0
performance <- evaluate_test_performance(ret = ret, X_test = X_test, Y_test = Y_test)
json_line(epochs * ceiling(nrow(X_train) / m), nrow(X_train) / m, performance$err,
          performance$neg_ll, dt[[ "user.self" ]] + dt[[ "sys.self" ]] - scoring_cpu,
          dt[[ "elapsed" ]] - scoring_elapsed, TRUE)
