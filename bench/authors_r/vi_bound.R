# The authors' VI bound (vi_multiclass_batch.R's lower_bound, eps = 0.001) at the parameters that
# vi_bound.py wrote to DIR:  AUTHORS_R_DIR=/path/to/theirs Rscript vi_bound.R DIR
d <- commandArgs(trailingOnly = TRUE)[ 1 ]
source(file.path(Sys.getenv("AUTHORS_R_DIR"), "Rcode/vi_code/vi_multiclass_batch.R"))
X <- as.matrix(read.csv(file.path(d, "X.csv"), header = FALSE)); dimnames(X) <- NULL
y <- scan(file.path(d, "y.csv"), quiet = TRUE)
K <- max(y)
m <- NULL; L <- list(); Z <- list(); log_sigma <- c(); log_sigma_0 <- c(); log_l <- NULL
readm <- function(f) unname(as.matrix(read.csv(file.path(d, f), header = FALSE)))
for (k in 1:K) {
  Z[[ k ]] <- readm(sprintf("Z%d.csv", k - 1))
  L[[ k ]] <- readm(sprintf("L%d.csv", k - 1))
  m <- cbind(m, scan(file.path(d, sprintf("m%d.csv", k - 1)), quiet = TRUE))
  h <- scan(file.path(d, sprintf("hyp%d.csv", k - 1)), quiet = TRUE)
  log_sigma <- c(log_sigma, h[ 1 ]); log_sigma_0 <- c(log_sigma_0, h[ 2 ]); log_l <- cbind(log_l, h[ -(1:2) ])
}
w <- encodeParameters(m, L, Z, log_sigma, log_sigma_0, log_l, K)
cat(sprintf("the authors' lower_bound there: %.6f\n", lower_bound(w, X, y, nrow(Z[[ 1 ]]), 0.001, ncol(X), K)))
