# One train/test split of one data set through one of the authors' batch methods.
#
#   Rscript run_split.R METHOD DATA_DIR SPLIT OUT_JSONL
#
# METHOD is ep, sep, gfitc or vi; DATA_DIR holds X.csv, y.csv, itrain.csv and itest.csv as written
# by export_splits.py; SPLIT counts from 1; one JSON line is appended to OUT_JSONL.  The environment
# variable AUTHORS_R_DIR names a checkout of github.com/emakryo/scalable_multiclass_ep (see
# README.md).  The body below is the authors' experiments/satellite/*_batch/simulate_*_Satellite_Batch.R,
# with two changes only: the data come from DATA_DIR instead of satellite.dat and folds.dat, and the
# results go to one JSON line instead of their five text files.  Their defaults stand: m = 100 random
# training rows per class, log sigma = log sigma0 = 0, the median-distance length-scale heuristic
# (their kernel divides the inputs by sqrt(l)), 250 iterations.

args <- commandArgs(trailingOnly = TRUE)
method <- args[ 1 ]
data_dir <- args[ 2 ]
j <- as.integer(args[ 3 ])
out_file <- args[ 4 ]
m <- if (length(args) >= 5) as.integer(args[ 5 ]) else 100
authors <- Sys.getenv("AUTHORS_R_DIR")

code <- list(ep = "Rcode/ep_code/epMGPC_batch.R", sep = "Rcode/sep_code/sepMGPC_batch.R",
             gfitc = "Rcode/gfitc_code/epMGPC.R", vi = "Rcode/vi_code/vi_multiclass_batch.R")
source(file.path(authors, code[[ method ]]))

X <- as.matrix(read.csv(file.path(data_dir, "X.csv"), header = FALSE))
dimnames(X) <- NULL
data <- list(X = X, Y = factor(read.csv(file.path(data_dir, "y.csv"), header = FALSE)[[ 1 ]]))
folds <- list(itrain = as.matrix(read.csv(file.path(data_dir, "itrain.csv"), header = FALSE)),
              itest = as.matrix(read.csv(file.path(data_dir, "itest.csv"), header = FALSE)))

# Their VI script does not seed per split (vi_multiclass_batch.R calls set.seed(1) when sourced).
if (method != "vi") set.seed(j)

X_train <- data$X[ folds$itrain[ j, ] , ]
Y_train <- data$Y[ folds$itrain[ j, ] ]

means <- apply(X_train, 2, mean)
sds <- apply(X_train, 2, sd)
sds[ sds == 0 ] <- 1.0

X_train <- (X_train - matrix(means, nrow(X_train), ncol(X_train), byrow = TRUE)) /
  matrix(sds, nrow(X_train), ncol(X_train), byrow = TRUE)

# Heuristic for the length scale
M <- as.matrix(dist(X_train))
l <- median(M[upper.tri(M)])

X_test <- data$X[ folds$itest[ j, ] , ]
Y_test <- data$Y[ folds$itest[ j, ] ]

X_test <- (X_test - matrix(means, nrow(X_test), ncol(X_test), byrow = TRUE)) /
  matrix(sds, nrow(X_test), ncol(X_test), byrow = TRUE)

Xbar <- list()
for (i in 1 : length(levels(Y_train)))
	Xbar[[ i ]] <- X_train[ sample(1 : nrow(X_train),  m), ]

REPORT <- FALSE

nK <- length(levels(Y_train))
t0 <- proc.time()

ret <- switch(method,
  ep = epMGPCInternal(X_train, Y_train, m, Xbar_ini = Xbar, log_l = matrix(log(l), nK, ncol(X_train))),
  sep = epMGPCInternal(X_train, Y_train, m, Xbar_ini = Xbar, log_l = matrix(log(l), nK, ncol(X_train))),
  gfitc = epMGPCExternal_lBFGS(X_train, Y_train, m, Xbar_ini = Xbar, l = matrix(l, nK, ncol(X_train))),
  vi = fit_MSGPC_lBFGS(X_train, Y_train, m, Xbar_ini = Xbar, log_l = t(matrix(log(l), nK, ncol(X_train)))))

t_after <- proc.time()

pred_train <- predictMGPC(ret, X_train)
pred_test <- predictMGPC(ret, X_test)

err_train <- mean(pred_train$labels != Y_train)
neg_log_l_train <- -mean(log(pred_train$prob[ cbind(1:nrow(X_train), as.integer(Y_train))]))
err_test <- mean(pred_test$labels != Y_test)
neg_log_l_test <- -mean(log(pred_test$prob[ cbind(1:nrow(X_test), as.integer(Y_test))]))

dt <- t_after - t0
# the BLAS library's folder name (e.g. openblas-pthread), not its path
blas <- if (getRversion() >= "4.1.0") basename(dirname(extSoftVersion()[[ "BLAS" ]])) else ""
line <- sprintf(paste0('{"dataset": "%s", "method": "%s", "split": %d, "m": %d, "n_train": %d, ',
                       '"n_test": %d, "length_scale_heuristic": %.17g, "error": %.17g, "nll": %.17g, ',
                       '"train_error": %.17g, "train_nll": %.17g, "cpu_s": %.3f, "elapsed_s": %.3f, ',
                       '"r_version": "%s", "blas": "%s"}'),
                basename(normalizePath(data_dir)), method, j, m, nrow(X_train), nrow(X_test), l,
                err_test, neg_log_l_test, err_train, neg_log_l_train,
                dt[[ "user.self" ]] + dt[[ "sys.self" ]], dt[[ "elapsed" ]], R.version.string, blas)
cat(line, "\n", file = out_file, append = TRUE, sep = "")
